"""Every torch path on the configured device: profiling, SFT, GRPO, evaluation, the OOD probe.

Each test runs the same function on `cpu` and on `cuda`; the cuda cases are marked `gpu` and skip without a CUDA
device, so on a CPU box the device code path is still exercised (device='cpu' through the same functions).
On a GPU they catch the bugs of issue 15: CPU torch.Generators and CPU index/mask tensors handed to a CUDA model
(profiling's decode loop), SFT batches left on the CPU; and GRPO on a GPU with bf16 keeps fp32 master weights.
Run them on a GPU machine with `pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import json
import math

import pytest

from pivot_assets.core.config import PolicySection, SFTSection, TrainingSection
from pivot_assets.core.hardware import resolve_dtype

pytestmark = pytest.mark.scenario


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif("not __import__('torch').cuda.is_available()",
                                                                                  reason="no CUDA device")])]
TOOLS = [{"type": "function", "function": {"name": "get_order", "description": "Look an order up",
                                           "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}}]
STATE = [{"role": "user", "content": "Where is order A1?", "tool_calls": None, "tool_call_id": None}]
ACTION = {"type": "function_call", "name": "get_order", "arguments": '{"order_id": "A1"}'}


@pytest.mark.parametrize("device", DEVICES)
def test_profiling_decode_loop_on_device(embedded_model_dir, device):
    from pivot_assets.policies.base import GenerationRequest, SamplingConfig
    from pivot_assets.policies.factory import build_backend
    from pivot_assets.policies.transformers_backend import turn_generator

    assert turn_generator(0, "t", device).device.type == device
    backend = build_backend(PolicySection(device=device, dtype="auto", batch_size=8))
    assert backend.model.device.type == device
    requests = [GenerationRequest(f"t{i}", f"T{i}", 1, STATE, TOOLS) for i in range(2)]
    sampling = SamplingConfig(k=3, max_new_tokens=8, seed=1, top_p=0.9)
    first = [(s.turn_id, s.completion) for b in backend.generate(requests, sampling) for s in b]
    again = [(s.turn_id, s.completion) for b in backend.generate(requests, sampling) for s in b]
    assert len(first) == 6 and first == again  # per-turn generators on the device: reproducible draws


@pytest.mark.parametrize("device", DEVICES)
def test_sft_steps_on_device(embedded_model_dir, tmp_path, device):
    from pivot_assets.policies.models import load_tokenizer
    from pivot_assets.training.sft import build_turn_examples, train_sft

    tokenizer = load_tokenizer("embedded")
    messages = STATE + [{"role": "assistant", "content": None, "tool_call_id": None,
                         "tool_calls": [{"id": "c", "name": "get_order", "arguments": '{"order_id": "A1"}'}]}]
    examples = build_turn_examples([{"trajectory_id": "T", "messages": messages, "message_index": 1, "tools": TOOLS}],
                                   tokenizer, 256)
    rows = train_sft("embedded", examples, SFTSection(steps=2, batch_size=1), tmp_path / "sft",
                     resolve_dtype("auto", device), device=device)
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) for r in rows)  # finite: neither NaN nor +-inf
    assert (tmp_path / "sft" / "config.json").is_file()


@pytest.mark.parametrize("device", DEVICES)
def test_evaluation_and_ood_probe_on_device(embedded_model_dir, device):
    from pivot_assets.evaluation.heldout import local_accuracy
    from pivot_assets.evaluation.ood_probe import ood_accuracy, ood_probe_items
    from pivot_assets.verifiers import DomainVerifiers

    rows = [{"turn_id": "t1", "trajectory_id": "T", "domain": "shop", "expert_action": json.dumps(ACTION),
             "tools": json.dumps(TOOLS), "messages": STATE}]
    result = local_accuracy("embedded", rows, DomainVerifiers({"default": {"name": "tool_call"}}), k=2,
                            max_new_tokens=8, policy=PolicySection(device=device, dtype="auto"))
    assert result["n_pivots"] == 1 and 0.0 <= result["local_accuracy"] <= 1.0
    accuracy = ood_accuracy("embedded", ood_probe_items()[:4], max_new_tokens=6, device=device,
                            dtype=resolve_dtype("auto", device).dtype)
    assert 0.0 <= accuracy <= 1.0


@pytest.mark.gpu
@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="no CUDA device")
def test_grpo_on_gpu_keeps_fp32_master_weights_under_bf16(embedded_model_dir, tmp_path):
    """On a GPU with bf16, GRPO trains fp32 weights under bf16 autocast (bf16-stored weights round the updates at
    lr 1e-6 away: tests/training/test_bf16_updates.py); docs/engines.md's memory arithmetic follows."""
    from datasets import Dataset

    from pivot_assets.training.grpo import run_grpo
    from pivot_assets.verifiers import DomainVerifiers

    dataset = Dataset.from_dict({"prompt": [STATE, STATE], "tools": [json.dumps(TOOLS)] * 2,
                                 "expert_action": [json.dumps(ACTION)] * 2, "turn_id": ["a", "b"],
                                 "trajectory_id": ["A", "B"], "domain": ["shop", "shop"]})
    precision = resolve_dtype("auto", "cuda")
    options = TrainingSection(steps=2, num_generations=2, max_completion_length=16, eval_fraction=0.0,
                              grpo={"per_device_train_batch_size": 2})
    result = run_grpo(str(embedded_model_dir), dataset, DomainVerifiers({"default": {"name": "tool_call"}}), options,
                      tmp_path / "grpo", cpu_smoke=False, precision=precision, device="cuda")
    assert [r["step"] for r in result.steps] == [1, 2]
    saved = json.loads((tmp_path / "grpo" / "config.json").read_text())
    assert saved.get("dtype", saved.get("torch_dtype")) == "float32"
    assert result.grpo_config["bf16"] is precision.bf16


@pytest.mark.gpu
@pytest.mark.vllm
@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="no CUDA device")
def test_grpo_generates_with_vllm_colocated_on_gpu(embedded_model_dir, tmp_path):
    """training.grpo {use_vllm: true, vllm_mode: colocate}: TRL's vLLM engine shares the GPU and generates every
    group; the trainer syncs its weights into it each step (docs/evaluation.md: why not on a CPU)."""
    pytest.importorskip("vllm")
    from datasets import Dataset

    from pivot_assets.training.grpo import run_grpo
    from pivot_assets.verifiers import DomainVerifiers

    dataset = Dataset.from_dict({"prompt": [STATE, STATE], "tools": [json.dumps(TOOLS)] * 2,
                                 "expert_action": [json.dumps(ACTION)] * 2, "turn_id": ["a", "b"],
                                 "trajectory_id": ["A", "B"], "domain": ["shop", "shop"]})
    options = TrainingSection(steps=2, num_generations=2, max_completion_length=16, eval_fraction=0.0,
                              grpo={"per_device_train_batch_size": 2, "use_vllm": True, "vllm_mode": "colocate",
                                    "vllm_gpu_memory_utilization": 0.2})
    result = run_grpo(str(embedded_model_dir), dataset, DomainVerifiers({"default": {"name": "tool_call"}}), options,
                      tmp_path / "grpo", cpu_smoke=False, precision=resolve_dtype("auto", "cuda"), device="cuda")
    assert [r["step"] for r in result.steps] == [1, 2] and result.grpo_config["use_vllm"] is True
    assert len(result.completions_log) == 4  # 2 steps x one group of 2, generated by vLLM and scored
