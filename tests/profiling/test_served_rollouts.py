"""The rollouts step on a served engine (backend openai) against a small server the test runs: parts of whole turns
with no duplicate key, each sample the draw of its own seed, and a part lost to a kill regenerated alone."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import duckdb
import pytest

from pivot_assets.core.config import load_config
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.profiling.profiler import Profiler
from tests.projects import ingested_sample

K = 3


class _SeedEcho(BaseHTTPRequestHandler):
    """Answers each request with one text choice per n naming its seed: a sample shows which draw it is."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        choices = [{"index": i, "message": {"role": "assistant", "content": f"seed {body['seed']} choice {i}"},
                    "finish_reason": "stop"} for i in range(body["n"])]
        data = json.dumps({"choices": choices, "usage": {"prompt_tokens": 9, "completion_tokens": 2 * body["n"]}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())


@pytest.fixture
def served(tmp_path):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _SeedEcho)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    config = (f"warehouse: ./warehouse\nsample: {{n_trajectories: 12, seed: 0}}\npolicy: {{backend: openai, "
              f"base_url: 'http://127.0.0.1:{srv.server_address[1]}/v1', model: m, k: {K}, concurrency: 4}}\n")
    with ingested_sample(tmp_path, config) as root:
        yield root
    srv.shutdown()
    srv.server_close()


def _profile(root, part_rows: int) -> dict:
    profiler = Profiler.for_config(load_config(root / "pivot.yaml"))
    profiler.part_rows = part_rows  # several parts from a small sample
    return profiler.generate()


def _rows(wh: Warehouse) -> list[tuple]:
    return duckdb.sql(f"select turn_id, sample_index, completion from read_parquet('{wh.source_glob('rollouts')}') "
                      "order by all").fetchall()


def test_served_parts_resume_after_a_lost_part_with_no_duplicate_key(served):
    wh = Warehouse(served / "warehouse")
    n_turns = duckdb.sql(f"select count(*) from read_parquet('{wh.table_path('turns')}')").fetchone()[0]
    first = _profile(served, part_rows=10)
    rows = _rows(wh)
    assert first["rollouts_generated"] == len(rows) == n_turns * K
    assert len({(t, i) for t, i, _ in rows}) == len(rows)  # no duplicate key
    assert len({c for _, _, c in rows}) == len(rows)  # every sample its own seed's draw
    parts = wh.part_files("rollouts")
    assert len(parts) >= 3 and all(set(_turn_counts(p).values()) == {K} for p in parts)  # whole turns per part

    lost = parts[1]  # as if the run had been killed before this part was written
    lost_rows = duckdb.sql(f"select count(*) from read_parquet('{lost}')").fetchone()[0]
    lost.unlink()
    again = _profile(served, part_rows=10)
    assert again["rollouts_generated"] == lost_rows
    assert _rows(wh) == rows  # the same draws, each key once


def _turn_counts(part) -> dict:
    return dict(duckdb.sql(f"select turn_id, count(*) from read_parquet('{part}') group by turn_id").fetchall())


def test_pending_samples_are_each_turns_missing_indices_in_generation_order(served):
    """What is left to generate is read per turn (no row per sample): a turn with only sample 0 stored lacks 1..K-1,
    a complete turn nothing; raising k adds the new indices to every turn; the turns come in generation order."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from pivot_assets.profiling.profiler import turn_order

    wh = Warehouse(served / "warehouse")
    _profile(served, part_rows=10)
    part = wh.part_files("rollouts")[0]
    kept = pq.read_table(part).filter(pc.equal(pc.field("sample_index"), 0))
    partial = set(kept.column("turn_id").to_pylist())
    pq.write_table(kept, part)

    profiler = Profiler.for_config(load_config(served / "pivot.yaml"))
    order = turn_order(wh, profiler.turns)
    pending = profiler.pending_by_turn()
    assert list(pending.items()) == [(t, list(range(1, K))) for t in order if t in partial]
    # the same rows one by one, sample-major for an engine that takes one seed per call (a served one)
    assert not profiler.engine.turn_rows_together
    assert profiler.pending_samples() == [{"turn_id": t, "sample_index": i} for i in range(K) for t in pending
                                          if i in pending[t]]

    (served / "pivot.yaml").write_text((served / "pivot.yaml").read_text().replace(f"k: {K},", f"k: {K + 1},"))
    raised = Profiler.for_config(load_config(served / "pivot.yaml")).pending_by_turn()
    assert list(raised.items()) == [(t, [*range(1, K), K] if t in partial else [K]) for t in order]


def test_requests_are_each_turns_state_in_generation_order(served):
    """generation_request_stream (the trajectories read in file order, merged with the turns' positions) gives each
    turn the messages before it and its trajectory's tools, a trajectory's turns together and in message order."""
    from pivot_assets.core.shapes import rebuild_state
    from pivot_assets.profiling.profiler import generation_requests, select_turns, turn_order

    wh = Warehouse(served / "warehouse")
    turns = select_turns(wh, None)
    experts = set(turns[::2])
    requests = generation_requests(wh, turns, experts)
    assert [r.turn_id for r in requests] == turn_order(wh, turns)
    trajectories = {t["trajectory_id"]: t for t in duckdb.sql(
        f"select trajectory_id, messages, tools from read_parquet('{wh.table_path('trajectories')}')").to_arrow_table().to_pylist()}
    seen: list[str] = []
    for r in requests:
        trajectory = trajectories[r.trajectory_id]
        assert r.messages == rebuild_state(trajectory["messages"], r.message_index)
        assert r.tools == json.loads(trajectory["tools"] or "[]")
        assert r.expert == (trajectory["messages"][r.message_index] if r.turn_id in experts else None)
        if seen and seen[-1] != r.trajectory_id:
            assert r.trajectory_id not in seen  # a trajectory's turns are consecutive
        seen.append(r.trajectory_id)
    for earlier, later in zip(requests, requests[1:]):
        if earlier.trajectory_id == later.trajectory_id:
            assert earlier.message_index < later.message_index
