"""Part integrity (core/parts.py): every damage is named, set aside with its reason (never deleted), and a check
after that passes; the same on a local and on an S3 warehouse (a real SeaweedFS server on 127.0.0.1)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pivot_jobs.cli import check_parts
from pivot_assets.core import parts
from pivot_assets.core.catalog import REWARDS_SCHEMA, ROLLOUTS_SCHEMA
from pivot_assets.core.config import load_config
from pivot_assets.core.warehouse import ObjectPath, Warehouse


def rollouts(n: int, start: int = 0) -> pa.Table:
    return pa.Table.from_pylist([{"turn_id": f"t{i}", "trajectory_id": "x", "policy_fp": "p", "sampling_fp": "s",
                                  "sample_index": 0, "completion": "hello " * 50, "n_prompt_tokens": 10,
                                  "n_completion_tokens": 5, "finish_reason": "stop"} for i in range(start, start + n)],
                                schema=ROLLOUTS_SCHEMA)


def read_bytes(path) -> bytes:
    if isinstance(path, ObjectPath):
        with path.fs.open_input_stream(path.key) as f:
            return f.read()
    return path.read_bytes()


def write_bytes(path, data: bytes) -> None:
    if isinstance(path, ObjectPath):
        with path.fs.open_output_stream(path.key) as f:
            f.write(data)
    else:
        path.write_bytes(data)


@pytest.fixture(params=["local", "s3"])
def wh(request, tmp_path):
    if request.param == "local":
        return Warehouse(tmp_path / "wh")
    s3_env = request.getfixturevalue("s3_env")
    (tmp_path / "pivot.yaml").write_text(f"warehouse: {s3_env}\n")
    return Warehouse(load_config(tmp_path / "pivot.yaml").warehouse_dir)


def flip_data_byte(data: bytes) -> bytes:
    """A flipped byte in the first data page (the footer at the end still reads)."""
    i = 16
    return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]


DAMAGE = {
    "truncated": (lambda d: d[: len(d) // 2], "damaged", "unreadable Parquet footer"),
    "flipped bytes": (flip_data_byte, "damaged", "sha256 differs"),
    "zero-length": (lambda d: b"", "damaged", "zero-length file"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_part_is_named_set_aside_and_nothing_else_moves(wh, damage, capsys):
    good = [wh.append_part("rollouts", rollouts(20, 20 * i)) for i in range(3)]
    assert check_parts(wh) == 0
    assert "rollouts: ok: 3 parts, 0 damaged" in capsys.readouterr().out
    change, kind, reason = DAMAGE[damage]
    damaged = change(read_bytes(good[1]))
    write_bytes(good[1], damaged)

    assert check_parts(wh) == 1
    out = capsys.readouterr().out
    assert "rollouts: FAIL: 3 parts, 1 damaged, 0 missing, 0 foreign" in out
    assert f"{kind} {good[1]}: {reason}" in out

    moved = parts.repair(wh, ["rollouts"])
    assert [(p.kind, p.path) for p in moved] == [(kind, str(good[1]))]
    aside = wh.parts_dir(parts.DAMAGED_DIR) / "rollouts"
    assert read_bytes(aside / good[1].name) == damaged  # kept as it was found
    assert reason in read_bytes(aside / (good[1].name + ".reason")).decode()
    assert wh.part_files("rollouts") == [good[0], good[2]]
    assert wh.read_arrow("rollouts").num_rows == 40  # the intact parts read as before
    assert check_parts(wh) == 0


def test_foreign_and_missing_parts(wh, capsys):
    kept = wh.append_part("rollouts", rollouts(5))
    lost = wh.append_part("rollouts", rollouts(5, 5))
    rewards = wh.append_part("rollout_rewards", pa.Table.from_pylist(
        [{"turn_id": "t0", "policy_fp": "p", "sampling_fp": "s", "sample_index": 0, "verifier_fp": "v",
          "domain": "d", "reward": 1.0, "reason": "ok", "detail": None, "action": None}], schema=REWARDS_SCHEMA))
    stray = wh.parts_dir("rollouts") / "part-from-elsewhere.parquet"
    write_bytes(stray, read_bytes(rewards))  # a rewards part dropped into the rollouts folder
    if isinstance(lost, ObjectPath):
        lost.fs.delete_file(lost.key)
    else:
        lost.unlink()

    assert check_parts(wh) == 1
    out = capsys.readouterr().out
    assert "rollouts: FAIL: 2 parts, 0 damaged, 1 missing, 1 foreign, 1 without a record" in out
    assert f"foreign {stray}: columns" in out and f"missing {lost}{parts.RECORD_SUFFIX}" in out
    assert "rollout_rewards: ok: 1 parts" in out
    assert {p.kind for p in parts.repair(wh, ["rollouts"])} == {"foreign", "missing"}
    assert wh.part_files("rollouts") == [kept] and check_parts(wh) == 0


def test_a_damaged_input_table_stops_in_one_line_with_the_fix(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    wh.write_table("turns", pa.table({"turn_id": ["a"]}))
    path = wh.table_path("turns")
    path.write_bytes(path.read_bytes()[:10])
    with pytest.raises(RuntimeError) as e:
        parts.require_intact(wh, "turns", "pivot run --select turns")
    assert str(e.value).startswith(f"{path} is damaged (unreadable Parquet footer")
    assert str(e.value).endswith("fix: pivot run --select turns") and "\n" not in str(e.value)


def test_key_named_parts_rewritten_keep_matching_records(tmp_path):
    """A rerun that overwrites a key-named part (a shard's batch) rewrites its record too."""
    wh = Warehouse(tmp_path / "wh")
    for n in (3, 5):
        wh.append_part("rollouts", rollouts(n), key="batch-1")
    result = parts.check_table(wh, "rollouts")
    assert result.n_parts == 1 and not result.problems and result.n_unrecorded == 0


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (root mounts it; skips with the reason where mounting is not allowed)."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a size-limited tmpfs here: {done.stderr.strip() or done.returncode}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_fails_the_write_and_leaves_no_partial_part(small_disk, capsys):
    import numpy as np

    wh = Warehouse(small_disk / "wh")
    rng = np.random.default_rng(0)
    written = 0
    with pytest.raises(OSError, match="No space left on device"):
        for i in range(1000):
            table = rollouts(40, 40 * i).set_column(5, "completion", pa.array(
                [rng.bytes(2000).hex() for _ in range(40)]))  # incompressible: the disk fills in a few parts
            wh.append_part("rollouts", table)
            written += 1
    assert written >= 1
    assert not list((small_disk / "wh").rglob(".tmp-*"))  # the temp file of the failed write is gone
    result = parts.check_table(wh, "rollouts")
    assert not result.problems and result.n_parts - result.n_unrecorded == written
    # a part whose record could not be written is checked by its footer: it is complete, never half a file
    assert wh.read_arrow("rollouts").num_rows == 40 * result.n_parts
