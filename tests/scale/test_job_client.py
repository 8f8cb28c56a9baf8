"""The Ray job-server client waits for a head whose job module is still starting, and gives up with the server's
error after its window. The server here is a plain HTTP server on 127.0.0.1 that answers /api/version the way a
head does while its job module (re)starts (200, empty body) and then as a ready head does."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pivot_assets.profiling.ray_job import job_client


def _serve(bad_answers: int):
    calls = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            calls.append(self.path)
            body = b"" if len(calls) <= bad_answers else json.dumps(
                {"version": "4", "ray_version": "2.60.0", "ray_commit": "x", "session_name": "s"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}", calls


def test_a_head_that_answers_badly_at_first_is_waited_for():
    server, address, calls = _serve(bad_answers=2)
    try:
        client = job_client(address, wait_s=20)
        assert client.get_address() == address
        assert len(calls) > 2 and set(calls) == {"/api/version"}  # two bad answers, then the client's own checks
    finally:
        server.shutdown()


def test_a_head_that_never_answers_well_fails_after_the_window():
    server, address, calls = _serve(bad_answers=10**6)
    try:
        t0 = time.monotonic()
        with pytest.raises(Exception, match="Expecting value"):
            job_client(address, wait_s=2)
        waited = time.monotonic() - t0
        # it waited out its window, asking again after a bad answer (lower bounds: a loaded machine only adds time)
        assert waited >= 2 and len(calls) >= 2, (waited, calls)
        # ... and then gave up by itself with the server's error: a client that never gives up would ask on forever
        # (this server never answers well). The bound only has to tell the two apart: a 2 s window, one 1 s pause
        # and a slow last call take well under a minute even on a loaded 2-core machine.
        assert waited < 60, waited
    finally:
        server.shutdown()
