"""What the machine runs well: each stage's device and dtype, and the torch thread count (Dagster-free; the one
place they are chosen: stages ask `sft_precision`, `training_precision`, `policy_precision` and `training_device`).

dtype. bf16 is fast only where the hardware runs it natively: a CUDA device with bf16, or a CPU with the
avx512_bf16 or AMX instructions. Elsewhere torch falls back to a reference GEMM: on an AVX2-only EPYC one
lm_head-sized matmul forward+backward took 227 s under bf16 autocast and 5.7 s in fp32. So `dtype: auto`
(the default of every stage) picks bf16 only where it is native, an explicit `bfloat16` on a CPU without
it warns once with the reason, and the *resolved* dtype is what enters a policy's identity.

threads. torch's default (one thread per core) is pathological on a small, shared box: with 2 threads
on 2 busy cores every op waits for the descheduled sibling (bench/RESULTS_threads.md). `threads: auto`
takes half the usable cores, at least 1; `configure_torch` applies it in every process that runs torch.

`PIVOT_NATIVE_BF16=0|1` overrides the bf16 detection (to rehearse a CPU without bf16, or in tests).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import lru_cache

log = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "bfloat16")
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
_warned: set[str] = set()


@dataclass(frozen=True)
class Precision:
    """A resolved dtype and the reason it was chosen (logged once per run, kept in asset metadata)."""

    dtype: str  # float32 | bfloat16
    requested: str
    device: str
    reason: str

    @property
    def bf16(self) -> bool:
        return self.dtype == "bfloat16"

    def as_metadata(self) -> dict:
        return {"dtype": self.dtype, "dtype_requested": self.requested, "dtype_reason": self.reason}


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _forced_bf16() -> bool | None:
    value = os.environ.get("PIVOT_NATIVE_BF16", "").strip().lower()
    if value in ("0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    return None


def native_bf16(device: str = "cpu") -> tuple[bool, str]:
    """(runs bf16 natively, why) for a device: cpu, cuda or cuda:N."""
    forced = _forced_bf16()
    if forced is not None:
        return forced, f"PIVOT_NATIVE_BF16={int(forced)}"
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return False, "no CUDA device"
        ok = torch.cuda.is_bf16_supported()
        return ok, f"{torch.cuda.get_device_name(0)} {'supports' if ok else 'lacks'} bf16"
    flags = cpu_flags() & set(BF16_CPU_FLAGS)
    if flags:
        return True, f"CPU has {', '.join(sorted(flags))}"
    if not cpu_flags():  # no /proc/cpuinfo: ask torch's own CPU probe
        import torch

        if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
            return True, "torch reports avx512_bf16 or AMX"
    return False, "CPU has neither avx512_bf16 nor amx_bf16 (bf16 runs through a slow reference GEMM)"


def resolve_dtype(requested: str = "auto", device: str = "cpu") -> Precision:
    """`auto` -> bfloat16 where native, else float32; an explicit dtype is kept (bf16 without support warns once)."""
    if requested not in DTYPES:
        raise ValueError(f"dtype {requested!r}: expected one of {', '.join(DTYPES)}")
    native, why = native_bf16(device)
    if requested == "auto":
        return Precision("bfloat16" if native else "float32", requested, device, f"auto: {why}")
    if requested == "bfloat16" and not native:
        key = f"{device}:{why}"
        if key not in _warned:
            _warned.add(key)
            log.warning("dtype bfloat16 on %s without native bf16 (%s): expect it to be many times slower "
                        "than float32; use dtype: auto", device, why)
        return Precision(requested, requested, device, f"explicit, although {why}")
    return Precision(requested, requested, device, "explicit")


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def training_device() -> str:
    """Where GRPO, the ablation's arms and refresh rounds train: the GPU when there is one."""
    return "cuda" if has_cuda() else "cpu"


def sft_precision(cfg) -> Precision:
    """The warm-up's and the same-data SFT's dtype: `sft.dtype` on the policy's device."""
    return resolve_dtype(cfg.sft.dtype, cfg.policy.device)


def training_precision(cfg, device: str | None = None) -> Precision:
    """GRPO's dtype: `training.dtype` on `device` (default: training_device(); an asset's code version, computed
    without importing torch, passes "cpu")."""
    return resolve_dtype(cfg.training.dtype, training_device() if device is None else device)


def policy_precision(policy, device: str | None = None) -> Precision:
    """A local engine's dtype: a `policy:` section's (or evaluation's engine) `dtype` on its `device` (or on
    `device`: GRPO's vLLM rollout engine runs beside the trainer)."""
    return resolve_dtype(policy.dtype, policy.device if device is None else device)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """Half the usable cores, at least 1 (measured in bench/bench_threads.py; see the module docstring)."""
    return max(1, usable_cores() // 2)


def resolve_threads(requested: int | str | None = "auto") -> int:
    if requested in (None, "auto"):
        return default_threads()
    n = int(requested)
    if n < 1:
        raise ValueError(f"threads {requested!r}: must be >= 1 or auto")
    return n


def configure_torch(threads: int | str | None = "auto") -> int:
    """Set torch's intra-op threads for this process (every process that runs torch calls this first)."""
    import torch

    n = resolve_threads(threads)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def describe_cpu() -> str:
    """One line for bench results: model name, cores, and the flags that matter for bf16."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    wanted = ("avx2", "avx512f", *BF16_CPU_FLAGS, "amx_tile")
    have = [f for f in wanted if f in cpu_flags()]
    return f"{model}, {usable_cores()} usable cores, flags: {' '.join(have) or 'none of ' + ' '.join(wanted)}"
