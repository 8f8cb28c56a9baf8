"""Imported turn profiles (Dagster-free): the profiles NeMo-Gym pivot rows arrive with, as a table of their own.

A pivot row (responses format with `expected_action`) is ingested as one trajectory whose last assistant message is
the pivot (ingest/formats/responses.py); its profile fields (ingest/formats/profiles.py) become that turn's row in
`imported_profiles` (catalog.IMPORTED_PROFILES_SCHEMA) with its source: profile_source `imported`, the model the
row's `<model>_info` names, the input file and its content fingerprint. The table sits beside the profiles the
project samples (`turn_profiles`): a turn can have both, and `pivots.profile_source` says which one selection reads.
Nothing is sampled and no policy is loaded: the asset is in the ingest group, whose runs load no model.

The rows are read again from the configured inputs with the ingest's own rules (ingest_record), so a row's
trajectory and turn ids are the ones `trajectories` and `turns` hold. Rows the ingest quarantined (a malformed
profile among them) have no profile here; a row that repeats an earlier row's trajectory (a duplicate in the
ingest) keeps the first row's profile and is counted (`duplicate_rows`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa

from pivot_assets.core.catalog import IMPORTED_PROFILES_SCHEMA
from pivot_assets.core.ids import turn_id

from .formats import as_input, expand_paths, iter_raw_records
from .formats.ingest import ingest_record
from .formats.profiles import row_profile

PROFILE_SOURCE = "imported"
IMPORTED_VERIFIER = "imported"  # one verifier_fp for every imported row: the rows' own scoring, not a verifier here
IMPORT_VERSION = "1"  # code version of the import's rules (the inputs' fingerprint is added by the asset)


def imported_policy_fp(model: str | None) -> str:
    """The policy_fp of a profile a row's `<model>_info` names (`imported:unknown` when the row has only pass rates)."""
    return f"{PROFILE_SOURCE}:{model or 'unknown'}"


def import_profiles(inputs: Iterable[dict]) -> tuple[pa.Table, dict[str, int]]:
    """The imported profiles of the configured inputs (resolved, as ingest/inputs.resolved_inputs gives them) and
    the counts {rows_read, profiles, duplicate_rows, quarantined_rows}."""
    counts = {"rows_read": 0, "profiles": 0, "duplicate_rows": 0, "quarantined_rows": 0}
    rows: dict[str, dict] = {}
    for spec in inputs:
        for row in _profile_rows(spec, counts):
            if row["turn_id"] in rows:
                counts["duplicate_rows"] += 1
                continue
            rows[row["turn_id"]] = row
    counts["profiles"] = len(rows)
    return pa.Table.from_pylist(list(rows.values()), schema=IMPORTED_PROFILES_SCHEMA), counts


def _profile_rows(spec: dict, counts: dict[str, int]) -> Iterator[dict]:
    item = as_input(spec)
    fingerprints = {str(p): file_fingerprint(p) for p in expand_paths(item.path) if p.is_file()}
    for raw in iter_raw_records(item.path):
        if raw.error is not None or not isinstance(raw.value, dict) or "expected_action" not in raw.value:
            continue
        counts["rows_read"] += 1
        kind, row = ingest_record(raw, item.format, item.domain, item.answers)
        if kind != "trajectory":
            counts["quarantined_rows"] += 1  # the ingest quarantines it too, with the same reason
            continue
        profile = row_profile(raw.value)  # valid: the adapter quarantines a row whose profile is not
        if profile is None:
            continue
        yield _profile_row(row, profile, raw.value, fingerprints.get(raw.source))


def _profile_row(trajectory: dict, profile: dict, value: dict, source_fp: str | None) -> dict:
    pivot_index = len(trajectory["messages"]) - 1  # the expected action is the trajectory's last message
    metadata = value.get("metadata") if isinstance(value.get("metadata"), dict) else {}
    source_turn = metadata.get("turn_id")
    return {
        "turn_id": turn_id(trajectory["trajectory_id"], pivot_index), "trajectory_id": trajectory["trajectory_id"],
        "domain": trajectory["domain"], "policy_fp": imported_policy_fp(profile["model"]), "sampling_fp": None,
        "verifier_fp": IMPORTED_VERIFIER, **{k: profile[k] for k in ("k", "reward_mean", "reward_var", "reward_std",
                                                                      "n_pass", "rewards")},
        "n_distinct_actions": None, "profile_source": PROFILE_SOURCE, "model": profile["model"],
        "source": trajectory["source"], "source_fp": source_fp, "record": trajectory["record"],
        "source_turn_id": source_turn if isinstance(source_turn, str) and source_turn else None,
    }


def file_fingerprint(path: str | Path) -> str:
    """The content fingerprint of an input file (sha256, first 16 hex digits): the import's provenance."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]
