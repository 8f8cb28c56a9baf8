"""The out-of-domain probe (issue 7): does agentic training cost the policy its general skills?

The paper's retention question at small scale: a fixed, project-generated set of non-agentic prompts
(arithmetic, letter and word manipulation, short facts) with checkable answers, asked with the same
chat template as every other stage (one user turn, no tools), answered greedily. The set was chosen
so the base embedded model (SmolLM2-135M-Instruct) gets a good share right zero-shot (measured:
see OOD_BASELINE below), leaving room both to lose and to gain.

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

import torch

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
}

# Zero-shot greedy accuracy of the base embedded model on ood_probe_items() (max_new_tokens=20),
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


def ood_probe_items() -> list[dict]:
    """The fixed probe set: [{"prompt", "answer", "kind"}] (kind = category, see CATEGORY_MATCH)."""
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
    flags = 0 if match == "word_cased" else re.IGNORECASE
    return _whole_word(answer, completion, flags)


# -- generation ---------------------------------------------------------------------------------


def greedy_generate(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int = 64) -> list[str]:
    """Greedy completions of rendered prompt texts, batched with left padding; special tokens dropped."""
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # decoder-only batching: pad before the prompt, generate after it
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
                 *, dtype: str = "float32", device: str = "cpu", details: list | None = None) -> float:
    """Share of probe items the policy at model_dir ("embedded" or an HF dir) answers correctly.

    Greedy decoding, so `seed` only pins torch's RNG for reproducibility of anything stochastic.
    If `details` is a list, one {prompt, answer, kind, completion, correct} dict per item is appended.
    """
    from pivot_assets.policies.models import load_model

    items = ood_probe_items() if items is None else items
    if not items:
        raise ValueError("ood_accuracy: no probe items")
    torch.manual_seed(seed)
    model, tokenizer = load_model(str(model_dir), dtype=dtype, device=device)
    completions = probe_completions(model, tokenizer, items, max_new_tokens)
    verdicts = [is_correct(it, c) for it, c in zip(items, completions)]
    if details is not None:
        details.extend({**it, "completion": c, "correct": v} for it, c, v in zip(items, completions, verdicts))
    return sum(verdicts) / len(items)
