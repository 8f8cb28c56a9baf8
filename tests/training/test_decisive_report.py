"""The decisive comparison's report is a function of its committed unit files: `bench/decisive.py --report` on
bench/data/decisive_bfcl/ rebuilds bench/RESULTS_decisive_bfcl.md byte for byte (its plot is written elsewhere here,
so the committed one is left alone, and the line naming the plot is compared with the committed plot's name)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "bench" / "RESULTS_decisive_bfcl.md"
PLOT = "bench/RESULTS_decisive_bfcl_curves.png"

pytestmark = pytest.mark.scenario  # a bootstrap over every committed unit: ~10-25 s


def test_the_committed_report_rebuilds_from_the_committed_units(tmp_path):
    out, png = tmp_path / REPORT.name, tmp_path / "curves.png"
    shutil.copy(REPORT, out)  # the design section above the results is kept as it is; the results are rebuilt
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "decisive.py"), "--config", "configs/decisive_bfcl.yaml",
                           "--report", "--out", str(out), "--png", str(png)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert png.stat().st_size > 0
    assert out.read_text().replace(str(png), PLOT) == REPORT.read_text()
