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
