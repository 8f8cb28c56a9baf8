"""Layout-only changes of a reply (markdown and whitespace), shared by the facts tests and bench_verifiers.py."""

from __future__ import annotations

import re

BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+", re.M)


def numbered_and_flattened(text: str) -> str:
    """Bullets as numbers (a counter per indent, reset by any other line), then every line joined into one."""
    out, counters = [], {}
    for line in text.split("\n"):
        m = BULLET.match(line)
        if m:
            indent = len(m.group(1).expandtabs(4))
            counters = {k: v for k, v in counters.items() if k <= indent}
            counters[indent] = counters.get(indent, 0) + 1
            line = f"{m.group(1)}{counters[indent]}. {line[m.end():]}"
        elif line.strip():
            counters = {}
        out.append(line)
    return re.sub(r"\s*\n\s*", " ", "\n".join(out)).strip()
