"""Progress lines with rate and ETA for every long step (profiling, SFT, GRPO, evaluation), Dagster-free.

Lines go to `log` (a run's event log when a stage passes context.log.info) at most every `every_s`
seconds and at the end; on a terminal a live bar is drawn on stderr too.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Progress:
    """Progress of `total` units of work: "<unit>: done/total (rate/s, ETA ...)". Units found cached count as done
    but not in the rate (a cached unit takes no time: counted, it made the rate of the work meaningless)."""

    total: int
    unit: str = "rollouts"
    log: Callable[[str], None] | None = None
    every_s: float = 10.0
    done: int = 0
    worked: int = 0
    _t0: float = field(default_factory=time.perf_counter)
    _last_log: float = 0.0

    def update(self, n: int = 1, note: str = "", cached: bool = False) -> None:
        self.done += n
        self.worked += 0 if cached else n
        line = f"{self.unit}: {self.done}/{self.total} ({self.pace()})" + (f" {note}" if note else "")
        if sys.stderr.isatty():
            width = 30
            filled = int(width * self.done / max(self.total, 1))
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {line}   ")
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        now = time.perf_counter()
        if self.log and (now - self._last_log >= self.every_s or self.done >= self.total):
            self._last_log = now
            self.log(line)

    def reach(self, done: int, note: str = "") -> None:
        """Advance to `done` units, the last of them just worked: those before it that this run never saw were done
        by an earlier run (a training run resumed from its checkpoint) and count as cached."""
        if done - 1 > self.done:
            self.update(done - 1 - self.done, cached=True)
        if done > self.done:
            self.update(done - self.done, note)

    def pace(self) -> str:
        """The rate and ETA of the units that did work; none yet when every unit so far was cached."""
        if not self.worked:
            return "cached" if self.done else "starting"
        elapsed = time.perf_counter() - self._t0
        rate = self.worked / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        return f"{rate:.2f}/s, ETA {fmt_seconds(eta)}"


def fmt_seconds(s: float) -> str:
    if s == float("inf"):
        return "?"
    m, sec = divmod(int(s), 60)
    return f"{m}m{sec:02d}s" if m else f"{sec}s"
