"""`<think>` reasoning in completions: the `strip` mode and the thinking budget (Dagster-free, torch-free).

policy.thinking: keep | strip | off (models.PromptFormat). `off` is the template's switch and happens at
rendering; `strip` happens here, on each completion before it is stored; a budget (policy.thinking_budget,
transformers backend) closes a thought that reached its budget by forcing the closing tag into the sample,
the way s1's "budget forcing" does, so the model still answers within max_new_tokens.

A thought that is never closed (max_new_tokens ran out inside it) is left as it is in every mode: the
verifier scores it TRUNCATED, counted apart from wrong answers.
"""

from __future__ import annotations

import re

THINKING_MODES = ("keep", "strip", "off")
OPEN, CLOSE = "<think>", "</think>"
_CLOSED_THOUGHT = re.compile(r"^\s*<think>.*?</think>\s*", re.S)
_FORCED_CLOSE = "\n</think>\n\n"
_CALL_MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>")


def strip_thought(text: str) -> str:
    """The completion without its leading closed thought (or the orphan close a template-opened thought leaves).

    A thought that was never closed is kept whole: it is the evidence of truncation. As in the verifier's parser,
    reasoning comes first: a tag after the first tool-call marker, or in a completion that opens with JSON, is data."""
    if CLOSE not in text or text.lstrip()[:1] in ("{", "[") or text.lstrip().startswith("```"):
        return text
    cuts = [i for i in (text.find(m) for m in _CALL_MARKERS) if i >= 0]
    head, rest = (text[:min(cuts)], text[min(cuts):]) if cuts else (text, "")
    if CLOSE not in head:
        return text
    stripped = _CLOSED_THOUGHT.sub("", head, count=1)
    if stripped == head:  # an orphan close: the template opened the thought in the prompt
        before, _, after = head.partition(CLOSE)
        if OPEN in before:
            return text
        stripped = after.lstrip()
    return stripped + rest


def apply_thinking(text: str, mode: str) -> str:
    """A completion as stored under `policy.thinking` (only `strip` changes it)."""
    return strip_thought(text) if mode == "strip" else text


def opens_thought(prompt_text: str) -> bool:
    """True when the rendered prompt itself opened a thought the completion continues (an unclosed <think>)."""
    tail = prompt_text[-200:]
    return tail.rfind(OPEN) > tail.rfind(CLOSE)


class ThoughtBudget:
    """Per-row thought tracking for batched decoding: after `budget` tokens inside a thought, the closing tag's
    tokens are forced, one per step, instead of sampled ones.

    Rows are the decode loop's original row indices. A row is `open` when its prompt opened the thought or its
    completion starts with <think>; detection looks only at the first tokens and the last few (never the whole
    text per step)."""

    def __init__(self, tokenizer, budget: int, prompt_opened: list[bool]):
        self.tokenizer, self.budget = tokenizer, budget
        self.close_ids = tokenizer.encode(_FORCED_CLOSE, add_special_tokens=False)
        self.state = ["open" if o else "unknown" for o in prompt_opened]  # unknown | open | done
        self.count = [0] * len(prompt_opened)
        self.queue: list[list[int]] = [[] for _ in prompt_opened]
        self.forced_rows: set[int] = set()

    def override(self, row: int, sampled: int, tokens_so_far: list[int]) -> int:
        """The token row `row` emits this step: a forced closing token, or the sampled one."""
        if self.queue[row]:
            return self.queue[row].pop(0)
        if self.state[row] == "open" and self.count[row] >= self.budget:
            self.queue[row] = list(self.close_ids)
            self.forced_rows.add(row)
            self.state[row] = "done"
            return self.queue[row].pop(0)
        return sampled

    def observe(self, row: int, tokens: list[int]) -> None:
        """Update the row's state after it emitted its latest token (`tokens` = all its tokens so far)."""
        state = self.state[row]
        if state == "done":
            return
        if state == "unknown":
            head = self.tokenizer.decode(tokens[:8], skip_special_tokens=False).lstrip()
            if head.startswith(OPEN):
                self.state[row] = "open"
            elif not OPEN.startswith(head) or len(tokens) >= 8:
                self.state[row] = "done"  # no thought in this sample
            return
        self.count[row] += 1
        if CLOSE in self.tokenizer.decode(tokens[-6:], skip_special_tokens=False):
            self.state[row] = "done"
