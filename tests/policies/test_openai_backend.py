"""OpenAI backend against a small OpenAI-compatible chat server the test runs on 127.0.0.1."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pivot_assets.policies.base import GenerationRequest, SamplingConfig
from pivot_assets.policies.factory import build_backend
from pivot_assets.policies.openai_backend import OpenAIBackend, ServerError, request_seed

TOOLS = [{"type": "function", "function": {"name": "get_user", "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}]


class CannedChatServer(ThreadingHTTPServer):
    """Serves /v1/chat/completions: n choices alternating a tool call and plain text.

    fail_first: this many requests get a 503 first (to exercise retries); a model named "bad" gets a 400.
    """

    def __init__(self, fail_first: int = 0, keep_alive: bool = False):
        super().__init__(("127.0.0.1", 0), _KeepAliveHandler if keep_alive else _Handler)
        self.bodies: list[dict] = []
        self.clients: set[tuple] = set()  # (host, port) of each connection a request came on
        self.fail_left = fail_first
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server: CannedChatServer = self.server
        with server.lock:
            server.bodies.append(body)
            server.clients.add(self.client_address)
            fail = server.fail_left > 0
            server.fail_left -= int(fail)
        if self.path != "/v1/chat/completions":
            return self._send(404, {"error": "not found"})
        if fail:
            return self._send(503, {"error": "busy"})
        if body["model"] == "bad":
            return self._send(400, {"error": {"message": "unknown model"}})
        choices = []
        for i in range(body["n"]):
            if i % 2 == 0:
                msg = {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function",
                       "function": {"name": "get_user", "arguments": json.dumps({"id": f"u{i}"})}}]}
                choices.append({"index": i, "message": msg, "finish_reason": "tool_calls"})
            else:
                choices.append({"index": i, "message": {"role": "assistant", "content": "Hello."}, "finish_reason": "length"})
        self._send(200, {"choices": choices, "usage": {"prompt_tokens": 50, "completion_tokens": 10 * body["n"]}})


class _KeepAliveHandler(_Handler):
    protocol_version = "HTTP/1.1"  # connections stay open between requests (as vLLM's and SGLang's servers keep them)


@pytest.fixture
def server():
    servers = []

    def start(fail_first: int = 0, keep_alive: bool = False) -> CannedChatServer:
        srv = CannedChatServer(fail_first, keep_alive)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def _url(srv) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}/v1"


def _requests(n: int = 3):
    state = [
        {"role": "user", "content": "id u1", "tool_calls": None, "tool_call_id": None, "reasoning": None},
        {"role": "assistant", "content": None, "reasoning": "r", "tool_call_id": None,
         "tool_calls": [{"id": "x1", "name": "get_user", "arguments": '{"id":"u1"}'}]},
        {"role": "tool", "content": "{}", "tool_call_id": "x1", "tool_calls": None, "reasoning": None},
    ]
    return [GenerationRequest(f"t{i}", "T", i, state, TOOLS) for i in range(n)]


def test_samples_requests_and_hermes_rendering(server):
    srv = server()
    backend = build_backend({"backend": "openai", "base_url": _url(srv), "model": "m", "concurrency": 2})
    batches = list(backend.generate(_requests(3), SamplingConfig(k=2, max_new_tokens=64, seed=1)))
    samples = [s for b in batches for s in b]
    assert len(samples) == 6 and {s.turn_id for s in samples} == {"t0", "t1", "t2"}
    call = next(s for s in samples if s.sample_index == 0)
    parsed = json.loads(re.fullmatch(r"<tool_call>\n(.*)\n</tool_call>", call.completion, re.S).group(1))
    assert parsed == {"name": "get_user", "arguments": {"id": "u0"}} and call.finish_reason == "stop"
    text = next(s for s in samples if s.sample_index == 1)
    assert text.completion == "Hello." and text.finish_reason == "length"
    assert call.n_prompt_tokens == 50 and call.n_completion_tokens == 10
    body = srv.bodies[0]
    assert body["n"] == 2 and body["max_tokens"] == 64 and body["tools"] == TOOLS
    assert body["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"id":"u1"}'  # JSON text on the wire
    assert "reasoning" not in body["messages"][1] and body["messages"][2]["tool_call_id"] == "x1"
    assert backend.stats["samples"] == 6 and backend.stats["generated_tokens"] == 60
    assert backend.fingerprint == f"openai|{_url(srv)}|m"


def test_rows_one_request_each_as_a_k1_call_under_its_seed_over_reused_connections(server):
    """rows=: one n=1 request per (turn, sample index), seeded as a K=1 call under that row's seed would be (the
    same body), each sample numbered by its row; 40 requests travel on at most `concurrency` kept-alive connections."""
    srv = server(keep_alive=True)
    backend = OpenAIBackend(_url(srv), "m", concurrency=4, group_size=3)
    requests = _requests(10)
    plan = {r.turn_id: [(i, 100 + i) for i in range(4)] for r in requests}
    samples = [s for b in backend.generate(requests, SamplingConfig(k=4, seed=7), rows=plan) for s in b]
    assert sorted((s.turn_id, s.sample_index) for s in samples) == sorted((t, i) for t in plan for i in range(4))
    assert len(srv.bodies) == 40 and {b["n"] for b in srv.bodies} == {1}
    assert sorted(b["seed"] for b in srv.bodies) == sorted(request_seed(100 + i, t) for t in plan for i in range(4))
    one = OpenAIBackend(_url(srv), "m")
    list(one.generate(requests[:1], SamplingConfig(k=1, seed=102)))
    assert srv.bodies[-1] in srv.bodies[:-1]  # a K=1 call under row 2's seed sends row 2's body
    assert 1 <= len(srv.clients) <= 4 + 1  # the rows' connections, and the K=1 call's own
    backend.close()
    one.close()


def test_retries_transient_errors(server):
    srv = server(fail_first=2)
    backend = OpenAIBackend(_url(srv), "m", concurrency=1, backoff_s=0.01)
    samples = [s for b in backend.generate(_requests(1), SamplingConfig(k=2)) for s in b]
    assert len(samples) == 2 and len(srv.bodies) == 3


def test_clear_errors_on_refusal_and_exhausted_retries(server):
    srv = server(fail_first=100)
    with pytest.raises(ServerError, match="3 attempts.*HTTP 503"):
        list(OpenAIBackend(_url(srv), "m", max_retries=2, backoff_s=0.01).generate(_requests(1), SamplingConfig(k=1)))
    ok = server()
    with pytest.raises(ServerError, match="HTTP 400.*unknown model"):
        list(OpenAIBackend(_url(ok), "bad", backoff_s=0.01).generate(_requests(1), SamplingConfig(k=1)))
    with pytest.raises(ValueError, match="base_url"):
        build_backend({"backend": "openai", "model": "m"})


def test_a_thought_returned_apart_is_put_back_and_truncation_stays_visible():
    from pivot_assets.policies.openai_backend import choice_to_text
    from pivot_assets.verifiers import build_verifier
    from pivot_assets.verifiers.base import Reason

    expected = {"type": "message", "content": "Hello."}
    answered = choice_to_text({"content": "Hello.", "reasoning_content": "greet"}, "stop")
    assert answered == "<think>\ngreet\n</think>\n\nHello."
    cut = choice_to_text({"content": None, "reasoning_content": "I should think about"}, "length")
    assert cut == "<think>\nI should think about"
    verifier = build_verifier({"name": "tool_call"})
    assert verifier.score(expected, answered).reason == Reason.OK
    assert verifier.score(expected, cut).reason == Reason.TRUNCATED
