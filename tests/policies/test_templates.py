"""Chat templates and decoding: which template a model renders with (policy.chat_template), prompts identical
across profiling, SFT, GRPO and evaluation for a pivot whose state has tool calls and tool results, and one
decoding rule for profiling and GRPO's reward."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pivot_assets.core.config import PolicySection
from pivot_assets.core.ids import canonical_json
from pivot_assets.policies.base import GenerationRequest
from pivot_assets.policies.factory import build_backend
from pivot_assets.policies.models import (
    TOOL_CHAT_TEMPLATE,
    PromptFormat,
    decode_completion,
    load_tokenizer,
    policy_fingerprint,
    render_prompt,
    resolve_chat_template,
    stop_token_ids,
)

# A Qwen3-shaped template (tools in the system turn, <tool_call> blocks, tool results as <tool_response> inside a
# user turn, the enable_thinking switch pre-filling an empty thought), written for these tests; unlike the embedded
# template it has no default system prompt, so the two render different prompts.
QWEN_LIKE = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' %}<|im_start|>user
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{{ message.content }}{% for tc in message.tool_calls or [] %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}{% endif %}"""
NO_TOOLS = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" \
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"

TOOLS = [{"type": "function", "function": {"name": "get_order", "description": "Look an order up",
                                           "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                                                          "required": ["order_id"]}}}]
MESSAGES = [
    {"role": "system", "content": "You are a store assistant.", "tool_calls": None, "tool_call_id": None},
    {"role": "user", "content": "Where is order #W1?", "tool_calls": None, "tool_call_id": None},
    {"role": "assistant", "content": None, "tool_call_id": None,
     "tool_calls": [{"id": "c1", "name": "get_order", "arguments": '{"order_id":"#W1"}'}]},
    {"role": "tool", "content": '{"status": "shipped"}', "tool_call_id": "c1", "tool_calls": None},
    {"role": "assistant", "content": "Order #W1 has shipped.", "tool_calls": None, "tool_call_id": None},
]
PIVOT_INDEX = 4  # the reply after the tool result: its state has a tool call and a tool result


def model_dir_with_template(src: Path, dst: Path, template: str | None) -> Path:
    """A copy of the embedded model dir (weights linked) whose own chat template is `template`."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name == "chat_template.jinja":
            continue
        (dst / f.name).symlink_to(f) if f.suffix == ".safetensors" else shutil.copy(f, dst / f.name)
    if template is not None:
        (dst / "chat_template.jinja").write_text(template)
    return dst


@pytest.fixture(scope="module")
def qwen_dir(embedded_model_dir, tmp_path_factory) -> Path:
    return model_dir_with_template(embedded_model_dir, tmp_path_factory.mktemp("m") / "qwen_like", QWEN_LIKE)


def test_template_resolution(embedded_model_dir, qwen_dir, tmp_path):
    no_tools = model_dir_with_template(embedded_model_dir, tmp_path / "no_tools", NO_TOOLS)
    bare = model_dir_with_template(embedded_model_dir, tmp_path / "bare", None)
    assert resolve_chat_template("embedded") == (TOOL_CHAT_TEMPLATE, "embedded")
    assert resolve_chat_template(str(qwen_dir)) == (QWEN_LIKE, "model")  # the model's own, it renders tools
    assert resolve_chat_template(str(qwen_dir), "embedded") == (TOOL_CHAT_TEMPLATE, "embedded")
    assert resolve_chat_template(str(no_tools)) == (TOOL_CHAT_TEMPLATE, "embedded (fallback)")  # would drop tools
    assert resolve_chat_template(str(no_tools), "model") == (NO_TOOLS, "model")  # on request
    assert resolve_chat_template(str(bare))[1] == "embedded (fallback)"
    with pytest.raises(ValueError, match="ships no chat template"):
        resolve_chat_template(str(bare), "model")
    path = tmp_path / "mine.jinja"
    path.write_text(NO_TOOLS)
    assert resolve_chat_template(str(qwen_dir), str(path)) == (NO_TOOLS, str(path))
    with pytest.raises(ValueError, match="no such file"):
        resolve_chat_template(str(qwen_dir), str(tmp_path / "missing.jinja"))
    # the template is part of the policy identity: another template, another fingerprint
    fps = {policy_fingerprint(str(qwen_dir), PromptFormat(t)) for t in ("auto", "embedded", str(path))}
    assert len(fps) == 3
    assert policy_fingerprint(str(qwen_dir), PromptFormat("auto", "off")) != policy_fingerprint(str(qwen_dir))


def test_embedded_template_only_for_the_embedded_model(embedded_model_dir, qwen_dir):
    """The embedded default system prompt ("... SmolLM") never reaches another model's prompt."""
    state = [{"role": "user", "content": "hi", "tool_calls": None, "tool_call_id": None}]
    own = render_prompt(load_tokenizer(str(qwen_dir)), state, TOOLS)
    assert "SmolLM" not in own and '"name": "get_order"' in own
    assert "SmolLM" in render_prompt(load_tokenizer("embedded"), state, TOOLS)


@pytest.mark.scenario
@pytest.mark.parametrize("chat_template,thinking", [("model", "off"), ("embedded", "keep")])
def test_prompts_identical_across_profiling_sft_grpo_evaluation(qwen_dir, chat_template, thinking):
    from datasets import Dataset

    from pivot_assets.curation.exports import hf_table
    from pivot_assets.evaluation.heldout import _requests
    from pivot_assets.training.grpo import _text_prompt_dataset
    from pivot_assets.training.sft import IGNORE_INDEX, turn_example

    policy = PolicySection(model=str(qwen_dir), chat_template=chat_template, thinking=thinking, dtype="float32")
    fmt = PromptFormat.from_policy(policy)
    state = MESSAGES[:PIVOT_INDEX]
    # profiling: the backend the rollouts asset builds, on the request generation_requests builds (tools as the
    # trajectories table stores them: canonical JSON, keys sorted)
    profiling_backend = build_backend(policy)
    stored_tools = json.loads(canonical_json(TOOLS))
    profiled = profiling_backend.prompt_text(GenerationRequest("t", "T", PIVOT_INDEX, state, stored_tools))
    # GRPO: the exported pivot row, rendered by run_grpo's dataset step with run_grpo's tokenizer
    tokenizer = load_tokenizer(str(qwen_dir), fmt)
    pivot = {"turn_id": "t", "trajectory_id": "T", "expert_action": json.dumps({"type": "message", "content": "x"})}
    grpo = _text_prompt_dataset(Dataset(hf_table([(pivot, state, TOOLS)])), tokenizer, set())["prompt"][0]
    # evaluation: local_accuracy's requests from the same exported row, through the same engine
    row = Dataset(hf_table([(pivot, state, TOOLS)]))[0]
    evaluated = profiling_backend.prompt_text(_requests([row])[0])
    # SFT: the per-turn example's prompt tokens (labels ignored) decode to the same prompt
    example, why = turn_example(tokenizer, MESSAGES, PIVOT_INDEX, stored_tools, 4096)
    assert why is None
    sft_prompt = tokenizer.decode([t for t, lab in zip(example["input_ids"], example["labels"]) if lab == IGNORE_INDEX])

    assert profiled == grpo == evaluated == sft_prompt
    assert '{"status": "shipped"}' in profiled and '"order_id": "#W1"' in profiled and "get_order" in profiled
    if chat_template == "model":
        assert "SmolLM" not in profiled and profiled.endswith("<think>\n\n</think>\n\n")  # thinking off, the switch
    else:
        assert profiled.startswith("<|im_start|>system\nYou are a store assistant.")


def test_one_decoding_rule_for_profiling_and_grpo(qwen_dir):
    """GRPO's reward re-decodes TRL's completion_ids with profiling's rule: special tokens kept, the stop cut."""
    from pivot_assets.training.grpo import make_verifier_reward
    from pivot_assets.verifiers import DomainVerifiers

    tokenizer = load_tokenizer(str(qwen_dir))
    text = '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "#W1"}}\n</tool_call>'
    # a special token inside the completion: TRL's skip_special_tokens=True would drop it, profiling keeps it
    ids = tokenizer.encode("<|im_start|>" + text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    profiled, stopped = decode_completion(tokenizer, ids, stop_token_ids(tokenizer))
    assert stopped and profiled == "<|im_start|>" + text
    assert tokenizer.decode(ids, skip_special_tokens=True) != profiled  # what TRL alone would have scored
    reward = make_verifier_reward(DomainVerifiers({"default": {"name": "tool_call"}}), tokenizer)
    expected = json.dumps({"type": "function_call", "name": "get_order", "arguments": {"order_id": "#W1"}})
    reward(prompts=["p"], completions=[tokenizer.decode(ids, skip_special_tokens=True)], completion_ids=[ids],
           expert_action=[expected])
    assert reward.completions_log[0]["completion"] == profiled


def test_grpo_prompt_tokens_equal_profiling_with_a_template_that_writes_its_bos(embedded_model_dir, tmp_path):
    """Llama 3 templates write <|begin_of_text|> and their tokenizers add a BOS to text: TRL's tokenization of the
    GRPO prompt must not get a second one (profiling tokenizes without special tokens)."""
    from datasets import Dataset

    from pivot_assets.curation.exports import hf_table
    from pivot_assets.training.grpo import _text_prompt_dataset

    model = model_dir_with_template(embedded_model_dir, tmp_path / "bos", "{{ bos_token }}" + QWEN_LIKE)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": True,
                                                             "bos_token": "<|endoftext|>"}))
    tokenizer = load_tokenizer(str(model))
    state, tools = MESSAGES[:PIVOT_INDEX], json.loads(canonical_json(TOOLS))
    profiled_ids = tokenizer(render_prompt(tokenizer, state, tools), add_special_tokens=False)["input_ids"]
    assert profiled_ids[0] == tokenizer.bos_token_id and profiled_ids[1] != tokenizer.bos_token_id
    pivot = {"turn_id": "t", "trajectory_id": "T", "expert_action": json.dumps({"type": "message", "content": "x"})}
    prompt = _text_prompt_dataset(Dataset(hf_table([(pivot, state, tools)])), tokenizer, set())["prompt"][0]
    assert tokenizer(text=[prompt])["input_ids"][0] == profiled_ids  # what GRPOTrainer's _tokenize_prompts does
