"""One engine for checkpoints scored in turn (policies/factory.EngineSlot): which checkpoints may share an engine
(same_family), and the slot's fallback for an engine that cannot reload weights (a new engine per checkpoint).
The reload itself, on vLLM, is tested in test_vllm.py against engines started on each checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pivot_assets.policies.factory import EngineSlot
from pivot_assets.policies.models import same_family

TOKENIZER_AND_GENERATION = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                            "generation_config.json")


def perturbed_checkpoint(base: Path, out: Path, scale: float = 0.05) -> Path:
    """A checkpoint of `base`'s family with other weights (the token embeddings, tied to the LM head, and layer 0's
    MLP shifted by seeded noise), saved as a trainer saves one (transformers' save_pretrained), with base's
    tokenizer and generation files."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in [*model.model.layers[0].mlp.parameters(), model.model.embed_tokens.weight]:
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    model.save_pretrained(out)
    for name in TOKENIZER_AND_GENERATION:
        if (base / name).is_file():
            shutil.copy(base / name, out / name)
    return out


@pytest.fixture(scope="module")
def other_checkpoint(embedded_model_dir, tmp_path_factory) -> Path:
    return perturbed_checkpoint(embedded_model_dir, tmp_path_factory.mktemp("other") / "model")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_a_fine_tuned_checkpoint_is_of_its_base_family(embedded_model_dir, other_checkpoint):
    assert same_family(embedded_model_dir, other_checkpoint)
    assert same_family(other_checkpoint, embedded_model_dir)


def test_another_vocabulary_or_architecture_is_not(embedded_model_dir, tmp_path):
    vocab = _copy(embedded_model_dir, tmp_path / "vocab")
    tok = json.loads((vocab / "tokenizer.json").read_text())
    tok["added_tokens"].append({**tok["added_tokens"][-1], "id": tok["added_tokens"][-1]["id"] + 1, "content": "<x>"})
    (vocab / "tokenizer.json").write_text(json.dumps(tok))
    assert not same_family(embedded_model_dir, vocab)

    special = _copy(embedded_model_dir, tmp_path / "special")
    config = json.loads((special / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|im_start|>"
    (special / "tokenizer_config.json").write_text(json.dumps(config))
    assert not same_family(embedded_model_dir, special)

    deeper = _copy(embedded_model_dir, tmp_path / "deeper")
    config = json.loads((deeper / "config.json").read_text())
    config["num_hidden_layers"] += 1
    (deeper / "config.json").write_text(json.dumps(config))
    assert not same_family(embedded_model_dir, deeper)

    template = _copy(embedded_model_dir, tmp_path / "template")  # a template is resolved per checkpoint: same family
    (template / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert same_family(embedded_model_dir, template)


def test_an_engine_that_cannot_reload_gets_a_new_engine_per_checkpoint(embedded_model_dir, other_checkpoint):
    from pivot_assets.policies.base import GenerationRequest, SamplingConfig

    request = [GenerationRequest("t", "T", 1, [{"role": "user", "content": "Say hi."}], [])]
    sampling = SamplingConfig(k=2, temperature=1.0, max_new_tokens=6, seed=3)
    draw = lambda e: [s.completion for batch in e.generate(request, sampling) for s in batch]  # noqa: E731
    with EngineSlot({"backend": "transformers", "dtype": "float32"}) as slot:
        first = slot.engine_for(str(embedded_model_dir))
        on_base = draw(first)
        assert slot.engine_for(str(embedded_model_dir)) is first  # the same checkpoint: the same engine
        second = slot.engine_for(str(other_checkpoint))
        assert second is not first and (slot.starts, slot.reloads) == (2, 0)
        assert draw(second) != on_base
    assert slot.engine is None
