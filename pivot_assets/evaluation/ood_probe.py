"""The out-of-domain probe: does agentic training cost the policy its general skills?

The paper's retention question at small scale: a fixed, project-generated set of non-agentic prompts with
checkable answers, asked with the same chat template as every other stage (one user turn, no tools),
answered greedily, scored deterministically. The built-in probe (`ood_probe_items()`, generated in code, no
download) has 400+ items of two families: arithmetic over a grid of operands (plus, minus, times) and letter /
word manipulation over a fixed word list (first and last letter, letter count, uppercase, reversal), plus the
original hand-written facts. Bring your own with `evaluation.ood_probe: PATH` (a JSONL file, or a Hugging Face
dataset saved with save_to_disk) of {"prompt", "answer", "kind"} rows (`load_probe`).

Lenient answer matching (a 135M model answers in sentences, not bare tokens), by item kind:
- number (arithmetic, counting, numeric facts): the first number in the completion (digits, or a
  number word up to twenty) that does not already appear in the prompt must equal the answer; operands
  echoed back ("7 + 8 = 15") are skipped, so a wrong result never matches on an echoed operand. No
  number answer equals a number of its own prompt (checked by the tests).
- word (facts, reversal, word composition): the answer appears as a whole word, case-insensitively.
- word_cased (uppercasing): the answer appears as a whole word with its exact case.
- letter: the last quoted single letter ('C' or "c") equals the answer, case-insensitively; a
  completion that is just the letter also counts.
"""

from __future__ import annotations

import re

# category -> matcher kind
CATEGORY_MATCH = {
    "arithmetic": "number",
    "count": "number",
    "fact_number": "number",
    "letter": "letter",
    "uppercase": "word_cased",
    "reverse": "word",
    "compose": "word",
    "fact": "word",
    "exact": "exact",  # user probes: the whole stripped completion equals the answer (case-insensitive)
    "contains": "word",  # user probes: the answer appears as a whole word (case-insensitive)
}

# Zero-shot greedy accuracy of the base embedded model on the 43 hand-written items (max_new_tokens=20),
# measured on the 2-core dev machine (bench/bench_sft.py --ood; per kind in bench/RESULTS_sft.md).
OOD_BASELINE = 27 / 43

_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty".split())}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?|\b(?:" + "|".join(_NUMBER_WORDS) + r")\b", re.IGNORECASE)

_ARITHMETIC = [("plus", 2, 3), ("plus", 7, 8), ("plus", 15, 10), ("plus", 12, 5), ("plus", 20, 30),
               ("times", 3, 4), ("times", 7, 7), ("times", 5, 6), ("minus", 10, 3)]
_WORDS = ["cat", "dog", "apple", "house"]
_FACTS = [  # (question, answer, category)
    ("What is the capital of France?", "Paris", "fact"),
    ("What is the capital of Japan?", "Tokyo", "fact"),
    ("What is the capital of Canada?", "Ottawa", "fact"),
    ("What is the opposite of hot?", "cold", "fact"),
    ("What is the opposite of up?", "down", "fact"),
    ("What gas do plants absorb from the air?", "carbon dioxide", "fact"),
    ("Which ocean is the largest?", "Pacific", "fact"),
    ("What is the largest planet in our solar system?", "Jupiter", "fact"),
    ("What animal says moo?", "cow", "fact"),
    ("What color is a banana?", "yellow", "fact"),
    ("How many legs does a spider have?", "8", "fact_number"),
    ("How many legs does a dog have?", "4", "fact_number"),
    ("How many months are in a year?", "12", "fact_number"),
    ("How many hours are in a day?", "24", "fact_number"),
]
_OPS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}


# The generated families (deterministic grids; no number answer equals a number of its own prompt).
_PLUS = [(a, b) for b in (4, 9, 16, 23) for a in range(1, 21)]
_MINUS = [(a, b) for a in (20, 31, 45, 58, 72, 86) for b in (2, 3, 5, 7, 9, 11, 13, 15, 17, 19)]
_TIMES = [(a, b) for a in range(2, 12) for b in (3, 4, 6, 7, 8, 9)]
WORD_LIST = ("cat", "dog", "apple", "house", "river", "table", "green", "music", "light", "stone", "paper",
             "bread", "chair", "cloud", "horse", "lemon", "money", "night", "ocean", "pilot", "queen", "robot",
             "smile", "tiger", "water", "zebra", "garden", "planet", "window", "yellow", "basket", "candle",
             "doctor", "forest", "jacket", "kitten", "mirror", "pencil", "rabbit", "summer")


def _generated_items() -> list[dict]:
    items = []
    for op, grid in (("plus", _PLUS), ("minus", _MINUS), ("times", _TIMES)):
        for a, b in grid:
            answer = _OPS[op](a, b)
            if answer in (a, b):
                continue  # an echoed operand could never count as the answer
            items.append({"prompt": f"What is {a} {op} {b}? Answer with just the number.", "answer": str(answer),
                          "kind": "arithmetic"})
    for w in WORD_LIST:
        items.append({"prompt": f"What is the first letter of the word '{w}'?", "answer": w[0], "kind": "letter"})
        items.append({"prompt": f"What is the last letter of the word '{w}'?", "answer": w[-1], "kind": "letter"})
        items.append({"prompt": f"How many letters are in the word '{w}'?", "answer": str(len(w)), "kind": "count"})
        items.append({"prompt": f"Write the word '{w}' in uppercase letters.", "answer": w.upper(), "kind": "uppercase"})
        items.append({"prompt": f"Reverse the letters of the word '{w}'.", "answer": w[::-1], "kind": "reverse"})
    return items


# item kind -> probe family (intervals are reported over all items; families are for reading the details)
FAMILY = {"arithmetic": "arithmetic", "count": "words", "letter": "words", "uppercase": "words", "reverse": "words",
          "compose": "words", "fact": "facts", "fact_number": "facts", "exact": "user", "contains": "user"}


def ood_probe_items() -> list[dict]:
    """The built-in probe: the generated families, then the hand-written items, each prompt once:
    [{"prompt", "answer", "kind"}] (kind = category, see CATEGORY_MATCH)."""
    seen: set[str] = set()
    out = []
    for it in _generated_items() + _handwritten_items():
        if it["prompt"] not in seen:
            seen.add(it["prompt"])
            out.append(it)
    return out


def load_probe(path: str) -> list[dict]:
    """A user's probe: JSONL (one {"prompt", "answer", "kind"} per line; kind defaults to `exact`) or a
    Hugging Face dataset dir (datasets.load_from_disk) with those columns. Raises one line on a bad row."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        import datasets

        rows = list(datasets.load_from_disk(str(p)))
    elif p.is_file():
        import json

        rows = [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        raise ValueError(f"evaluation.ood_probe: no such file or directory: {p}")
    items = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not row.get("prompt") or row.get("answer") in (None, ""):
            raise ValueError(f"evaluation.ood_probe: {p} row {i + 1}: needs non-empty 'prompt' and 'answer'")
        kind = row.get("kind") or "exact"
        if kind not in CATEGORY_MATCH:
            raise ValueError(f"evaluation.ood_probe: {p} row {i + 1}: kind {kind!r}: expected one of {sorted(CATEGORY_MATCH)}")
        items.append({"prompt": str(row["prompt"]), "answer": str(row["answer"]), "kind": kind})
    if not items:
        raise ValueError(f"evaluation.ood_probe: {p} has no items")
    return items


def probe_items(path: str | None = None, max_items: int | None = None, seed: int | str = "ood") -> list[dict]:
    """The probe in force: load_probe(path) or the built-in one; with max_items, the first N in a seeded order
    (every family keeps about its share)."""
    from pivot_assets.core.ids import seeded_unit

    items = load_probe(path) if path else ood_probe_items()
    if max_items is not None and max_items < len(items):
        items = sorted(items, key=lambda it: seeded_unit(seed, it["prompt"]))[:max_items]
    return items


def _handwritten_items() -> list[dict]:
    """The original 43 hand-written items."""
    items = []
    for op, a, b in _ARITHMETIC:
        items.append({"prompt": f"What is {a} {op} {b}? Answer with just the number.",
                      "answer": str(_OPS[op](a, b)), "kind": "arithmetic"})
    for w in _WORDS:
        items.append({"prompt": f"What is the first letter of the word '{w}'?", "answer": w[0], "kind": "letter"})
    for w in _WORDS[:2]:
        items.append({"prompt": f"What is the last letter of the word '{w}'?", "answer": w[-1], "kind": "letter"})
    for w in _WORDS:
        items.append({"prompt": f"How many letters are in the word '{w}'?", "answer": str(len(w)), "kind": "count"})
    for w in _WORDS[:3]:
        items.append({"prompt": f"Write the word '{w}' in uppercase letters.", "answer": w.upper(), "kind": "uppercase"})
        items.append({"prompt": f"Reverse the letters of the word '{w}'.", "answer": w[::-1], "kind": "reverse"})
    for a, b in (("sun", "flower"), ("rain", "bow")):
        items.append({"prompt": f"Join the words '{a}' and '{b}' into one word.", "answer": a + b, "kind": "compose"})
    for w in _WORDS[:2]:
        items.append({"prompt": f"What is the plural of '{w}'?", "answer": w + "s", "kind": "compose"})
    for question, answer, kind in _FACTS:
        items.append({"prompt": f"{question} Answer briefly.", "answer": answer, "kind": kind})
    return items


# -- answer matching ----------------------------------------------------------------------------


def _number_value(token: str) -> float:
    return float(_NUMBER_WORDS.get(token.lower(), token)) if token.lower() in _NUMBER_WORDS else float(token)


def _numbers(text: str) -> list[float]:
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)  # 149,000 -> 149000
    return [_number_value(m.group(0)) for m in _NUMBER.finditer(text)]


def _whole_word(answer: str, text: str, flags: int) -> bool:
    return re.search(r"(?<!\w)" + re.escape(answer) + r"(?!\w)", text, flags) is not None


def is_correct(item: dict, completion: str) -> bool:
    """Lenient check of one completion against an item's answer (rules in the module docstring)."""
    match = CATEGORY_MATCH.get(item["kind"])
    if match is None:
        raise ValueError(f"OOD probe item kind {item['kind']!r}: expected one of {sorted(CATEGORY_MATCH)}")
    answer = item["answer"]
    if match == "number":
        in_prompt = set(_numbers(item["prompt"]))
        fresh = [n for n in _numbers(completion) if n not in in_prompt]
        return bool(fresh) and fresh[0] == float(answer)
    if match == "letter":
        quoted = re.findall(r"['\"‘’“”]([A-Za-z])['\"‘’“”]", completion)
        last = quoted[-1] if quoted else completion.strip().strip(".!'\"")
        return last.lower() == answer.lower()
    if match == "exact":
        return completion.strip().strip(".!'\"").strip().lower() == answer.strip().lower()
    flags = 0 if match == "word_cased" else re.IGNORECASE
    return _whole_word(answer, completion, flags)


# -- generation ---------------------------------------------------------------------------------


def greedy_generate(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int = 64) -> list[str]:
    """Greedy completions of rendered prompt texts, batched with left padding on the model's device; special tokens
    dropped (the probe grades plain answers; a thought is cut by the probe's prompt format, see probe_completions)."""
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # decoder-only batching: pad before the prompt, generate after it
    import torch  # lazy: building the pipeline's definitions must not pay torch's import

    out: list[str] = []
    try:
        for i in range(0, len(prompts), batch_size):
            enc = tokenizer(prompts[i:i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
            enc = {k: v.to(model.device) for k, v in enc.items()}
            with torch.no_grad():
                ids = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)
            out.extend(tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True))
    finally:
        tokenizer.padding_side = side
    return out


def probe_completions(model, tokenizer, items: list[dict], max_new_tokens: int = 20) -> list[str]:
    """The policy's greedy answer to each probe item (one user turn, the project's chat template)."""
    from pivot_assets.policies.models import render_prompt

    prompts = [render_prompt(tokenizer, [{"role": "user", "content": it["prompt"]}], None) for it in items]
    return greedy_generate(model, tokenizer, prompts, max_new_tokens)


def ood_accuracy(model_dir: str, items: list[dict] | None = None, max_new_tokens: int = 20, seed: int = 0,
                 *, dtype: str = "float32", device: str = "cpu", details: list | None = None, fmt=None) -> float:
    """Share of probe items the policy at model_dir ("embedded" or an HF dir) answers correctly.

    Greedy decoding, so `seed` only pins torch's RNG for reproducibility of anything stochastic. `fmt`: the
    policy's PromptFormat (chat template, thinking switch); a thought the model still writes is stripped before
    grading, and one cut off by max_new_tokens grades as wrong.
    If `details` is a list, one {prompt, answer, kind, completion, correct} dict per item is appended.
    """
    import torch

    from pivot_assets.policies.models import PromptFormat, load_model
    from pivot_assets.policies.thinking import strip_thought

    items = ood_probe_items() if items is None else items
    if not items:
        raise ValueError("ood_accuracy: no probe items")
    torch.manual_seed(seed)
    model, tokenizer = load_model(str(model_dir), dtype=dtype, device=device, fmt=fmt or PromptFormat())
    completions = [strip_thought(c) for c in probe_completions(model, tokenizer, items, max_new_tokens)]
    del model
    verdicts = [is_correct(it, c) for it, c in zip(items, completions)]
    if details is not None:
        details.extend({**it, "completion": c, "correct": v} for it, c, v in zip(items, completions, verdicts))
    return sum(verdicts) / len(items)
