"""Ids and hashes: one definition of each (Dagster-free).

`canonical_json` + `short_hash` fingerprint anything (config sections, verifier specs, data); the seeded
hashes are the one place a (seed, key) pair becomes a number, for per-turn generators, splits and draws.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(obj: Any) -> str:
    """Deterministic JSON text: sorted keys, no whitespace, UTF-8 kept as is."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def short_hash(text: str, n: int = 16) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def seeded_digest(seed: int | str, key: str) -> bytes:
    """sha256 of "seed:key": the one seeded hash (generators, the held-out split, random draws)."""
    return hashlib.sha256(f"{seed}:{key}".encode()).digest()


def seeded_unit(seed: int | str, key: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, key)."""
    return int(seeded_digest(seed, key).hex()[:15], 16) / float(16**15)


def seeded_int(seed: int | str, key: str, bits: int = 63) -> int:
    """A non-negative integer below 2**bits fixed by (seed, key) (a torch / server seed)."""
    return int.from_bytes(seeded_digest(seed, key)[:8], "little") & ((1 << bits) - 1)


def trajectory_id(messages: list[dict], tools: list | None) -> str:
    """Content hash of a canonical trajectory: same messages + tools -> same id, whatever the source. A tool call's
    `acceptable` counts only when it has one (rows read back from Parquet carry it as null; ids from before the
    column existed stay the same)."""
    return short_hash(canonical_json({"messages": _without_null_acceptable(messages), "tools": tools or []}))


def _without_null_acceptable(messages: list[dict]) -> list[dict]:
    if not any(call.get("acceptable", 0) is None for m in messages for call in (m.get("tool_calls") or [])):
        return messages
    return [{**m, "tool_calls": [{k: v for k, v in call.items() if not (k == "acceptable" and v is None)}
                                 for call in m["tool_calls"]]} if m.get("tool_calls") else m for m in messages]


def turn_id(trajectory_id_: str, message_index: int) -> str:
    """Stable turn key; the DuckDB twin is `substr(md5(trajectory_id || ':' || message_index), 1, 16)`."""
    return hashlib.md5(f"{trajectory_id_}:{message_index}".encode()).hexdigest()[:16]
