"""`<think>` handling: strip mode, the template switch, and the thinking budget on the real embedded model (a
prompt template that opens a thought, as reasoning models' templates do)."""

from __future__ import annotations

import pytest

from pivot_assets.core.config import PolicySection
from pivot_assets.policies.base import GenerationRequest, SamplingConfig
from pivot_assets.policies.factory import build_backend
from pivot_assets.policies.models import TOOL_CHAT_TEMPLATE
from pivot_assets.policies.thinking import apply_thinking, opens_thought, strip_thought
from pivot_assets.verifiers import build_verifier
from pivot_assets.verifiers.base import Reason

CALL = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'


@pytest.mark.parametrize("text,stripped", [
    (f"<think>\nplan\n</think>\n\n{CALL}", CALL),
    (f"plan, the template opened it\n</think>\n\n{CALL}", CALL),
    ("<think>\nstill going", "<think>\nstill going"),  # never closed: kept, it is the evidence of truncation
    (CALL, CALL),
    ('{"name": "f", "arguments": {"x": "</think>"}}', '{"name": "f", "arguments": {"x": "</think>"}}'),
])
def test_strip_thought(text, stripped):
    assert strip_thought(text) == stripped
    assert apply_thinking(text, "strip") == stripped
    assert apply_thinking(text, "keep") == apply_thinking(text, "off") == text


def test_opens_thought():
    assert opens_thought("<|im_start|>assistant\n<think>\n")
    assert not opens_thought("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opens_thought("<|im_start|>assistant\n")


def test_budget_needs_the_transformers_backend():
    with pytest.raises(ValueError, match="thinking_budget is implemented by the transformers backend"):
        build_backend({"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m", "thinking_budget": 8})


@pytest.mark.scenario
def test_budget_closes_thoughts_that_would_be_truncated(embedded_model_dir, tmp_path):
    """With a template that opens <think>, the 135M model never closes it: every sample is TRUNCATED. A budget
    forces </think> after N thought tokens, so the samples end their thought and the verifier sees an answer."""
    template = tmp_path / "thinking.jinja"
    template.write_text(TOOL_CHAT_TEMPLATE.replace("{{- '<|im_start|>assistant\\n' -}}\n{%- endif -%}",
                                                   "{{- '<|im_start|>assistant\\n<think>\\n' -}}\n{%- endif -%}"))
    request = GenerationRequest("t1", "T", 1, [{"role": "user", "content": "Say hi to Ann."}], [])
    sampling = SamplingConfig(k=2, max_new_tokens=12, seed=1)
    verifier = build_verifier({"name": "tool_call"})
    expected = {"type": "message", "content": "Hi Ann!"}

    plain = build_backend(PolicySection(chat_template=str(template), dtype="float32"))
    assert plain.prompt_text(request).endswith("<|im_start|>assistant\n<think>\n")
    unbounded = [s for b in plain.generate([request], sampling) for s in b]
    assert all("</think>" not in s.completion for s in unbounded)
    # profiling stores what the model wrote after the prompt: a thought with no close, i.e. a truncated sample
    assert {verifier.score(expected, "<think>\n" + s.completion).reason for s in unbounded} == {Reason.TRUNCATED}

    budget = build_backend(PolicySection(chat_template=str(template), dtype="float32", thinking_budget=4))
    bounded = [s for b in budget.generate([request], sampling) for s in b]
    assert budget.stats["thoughts_forced_closed"] == 2
    assert all("</think>" in s.completion for s in bounded)
    assert all(verifier.score(expected, s.completion).reason != Reason.TRUNCATED for s in bounded)
    stripped = build_backend(PolicySection(chat_template=str(template), dtype="float32", thinking_budget=4,
                                           thinking="strip"))
    assert all("</think>" not in s.completion for b in stripped.generate([request], sampling) for s in b)
