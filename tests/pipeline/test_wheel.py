"""`pip install .` (not editable) gives a working `pivot`: the wheel carries sql/ and data_contracts/ and no
top-level `definitions` module. Built and installed into a fresh environment, then run from outside the repo."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(cmd: list, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, f"{cmd}: {out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, REPO])
    return next(out.glob("pivot_curation-*.whl"))


def test_wheel_ships_sql_and_contracts_and_no_top_level_definitions(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"pivot_assets/sql/{p.name}" for p in (REPO / "sql").glob("*.sql")} <= set(names)
    assert {f"pivot_assets/data_contracts/{p.name}" for p in (REPO / "data_contracts").glob("*.json")} <= set(names)
    assert "pivot_assets/policies/chat_template.jinja" in names
    # Every package in the source tree is in the wheel (a missing one only fails at import, outside the repo).
    packages = {p.parent.relative_to(REPO).as_posix() for p in (REPO / "pivot_assets").rglob("__init__.py")}
    assert {f"{pkg}/__init__.py" for pkg in packages} <= set(names)
    assert not [n for n in names if n.split("/")[0] in ("definitions.py", "sql", "data_contracts", "tests")]


@pytest.mark.scenario
def test_installed_wheel_runs_pivot_sql_and_check_outside_the_repo(wheel, tmp_path):
    # No PYTHONPATH anywhere: with the repo on it, pip would find the source tree's egg-info and install nothing.
    env = {k: v for k, v in os.environ.items() if k not in ("PIVOT_CONFIG", "PYTHONPATH")}
    venv = tmp_path / "venv"
    _run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv], env=env)
    py = venv / "bin" / "python"
    _run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], env=env)
    # The dependencies come from this test's environment (a .pth line), not from the repo: the package
    # itself must resolve inside the new environment's site-packages.
    purelib = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env=env).stdout.strip()
    Path(purelib, "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    work = tmp_path / "project"
    work.mkdir()
    (work / "pivot.yaml").write_text("warehouse: ./wh\nsample: {n_trajectories: 4, seed: 0}\n")
    env.update(DAGSTER_HOME=str(work / "dagster_home"), HF_HUB_OFFLINE="1")
    where = _run([py, "-c", "import pivot_assets; print(pivot_assets.__file__)"], cwd=work, env=env).stdout
    assert where.startswith(purelib), where
    missing = subprocess.run([py, "-c", "import definitions"], cwd=work, env=env, capture_output=True)
    assert missing.returncode != 0, "the wheel installed a top-level `definitions` module"

    pivot = venv / "bin" / "pivot"
    _run([pivot, "run", "--select", "trajectories,turns"], cwd=work, env=env)
    summary = _run([pivot, "sql", "ingest_summary", "--format", "csv"], cwd=work, env=env).stdout.splitlines()
    header, rows = summary[0].split(","), [line.split(",") for line in summary[1:]]
    assert sum(int(r[header.index("n_trajectories")]) for r in rows) == 4, summary
    checks = _run([pivot, "check"], cwd=work, env=env).stdout
    assert "trajectories: PASS" in checks and "turns: PASS" in checks, checks
