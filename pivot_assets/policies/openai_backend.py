"""OpenAI-compatible backend: profile on any served model (vLLM, SGLang, llama.cpp) over HTTP.

Endpoint: POST {base_url}/chat/completions with `tools` and `n=K` per turn. The server applies the chat
template *it* has for the model (for a local model dir: the one in its tokenizer files, which is what
`policy.chat_template: model` renders locally; the test against `transformers serve` checks the two agree).
Tool calls come back structured (`message.tool_calls`) where the server parses them, else as text; structured
calls are written back as Hermes text (`<tool_call>{"name", "arguments"}</tool_call>`), so the verifier parses
every backend's completions the same way. Decoding is the server's (most skip special tokens).

Choices are counted: a server that returns fewer than n (`transformers serve` returns one) is asked again for
the rest, each follow-up with its own seed, until the turn has K samples.
Per-sample token counts: servers report usage per request, so n_completion_tokens is that request's
usage.completion_tokens / its number of choices (rounded), and n_prompt_tokens is usage.prompt_tokens.
Seeds: the first request of a turn carries seed = hash(seed, turn_id), follow-ups hash(seed, turn_id#i).
Per-sample seeding (`rows=`, profiling's default): one n=1 request per (turn, sample index), seeded hash(row seed,
turn_id), the body a K=1 call under that seed sends. Requests go out from one asyncio loop over at most `concurrency`
kept-alive HTTP/1.1 connections: no connection, thread or JSON encoding of the turn per request.
`policy.thinking: off` sends chat_template_kwargs {enable_thinking: false} (vLLM and SGLang pass it to the
template); `strip` cuts a closed thought from each completion, as the local backends do.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import threading
import time
import urllib.parse
import weakref
from collections.abc import Iterator

from pivot_assets.core.ids import seeded_int

from .base import GenerationRequest, Sample, SamplingConfig, new_stats, order_by_trajectory
from .models import openai_tool_order, tool_call_text
from .thinking import apply_thinking

RowSeeds = dict[str, list[tuple[int, int]]]  # turn_id -> [(sample_index, seed), ...]: one n=1 request each

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class ServerError(RuntimeError):
    """A request the server refused for good (4xx other than throttling), or retries exhausted."""


def to_openai_messages(messages: list[dict]) -> list[dict]:
    """Canonical messages -> OpenAI chat messages (arguments stay JSON text; reasoning dropped)."""
    out = []
    for m in messages:
        msg = {"role": m["role"], "content": m.get("content")}
        if m.get("tool_calls"):
            msg["tool_calls"] = [
                {"id": c.get("id") or f"call_{i}", "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"] if isinstance(c["arguments"], str) else json.dumps(c["arguments"])}}
                for i, c in enumerate(m["tool_calls"])
            ]
        if m["role"] == "tool":
            msg["tool_call_id"] = m.get("tool_call_id") or ""
            msg["content"] = m.get("content") or ""
        out.append(msg)
    return out


def choice_to_text(message: dict, finish_reason: str | None = None) -> str:
    """A chat choice as Hermes text: its thought, content, then one <tool_call> block per structured call.

    Arguments that are not a JSON object are kept verbatim inside the block, so the verifier sees
    (and rejects) exactly what the model produced. A thought a server returned apart (vLLM/SGLang reasoning
    parsers: `reasoning_content` or `reasoning`) is put back as <think>...</think>, left open when the choice
    stopped for length with no answer: the verifier then scores TRUNCATED, as for a local backend.
    """
    text = message.get("content") or ""
    thought = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(thought, str) and thought:
        cut_off = finish_reason == "length" and not text and not message.get("tool_calls")
        text = f"<think>\n{thought}" + ("" if cut_off else f"\n</think>\n\n{text}")
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        name, args = fn.get("name") or "", fn.get("arguments")
        try:
            block = tool_call_text(name, args)
        except ValueError:
            block = '<tool_call>\n{"name": ' + json.dumps(name) + ', "arguments": ' + str(args) + "}\n</tool_call>"
        text = f"{text}\n{block}" if text else block
    return text


def openai_fingerprint(base_url: str, model: str) -> str:
    """A served model has no weights file to hash: (base_url, served name) is its identity.

    Same formula as pivot_assets.profiling.current_fingerprints, which computes it without a backend.
    """
    return f"openai|{base_url}|{model}"


def request_seed(seed: int, turn_id: str) -> int:
    return seeded_int(seed, turn_id, bits=31)


class OpenAIBackend:
    """K samples per turn from an OpenAI-compatible chat server, `concurrency` requests in flight.

    Requests go out from one asyncio loop (a thread of its own, started on first use) over at most `concurrency`
    HTTP/1.1 connections kept alive and reused; a turn's body is encoded once and shared by its requests (only n and
    seed differ). While the caller writes one group's samples, the next group's requests are in flight."""

    def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY", concurrency: int = 8,
                 timeout_s: float = 300.0, max_retries: int = 5, backoff_s: float = 1.0, group_size: int | None = None,
                 thinking: str = "keep"):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = os.environ.get(api_key_env) or None
        self.concurrency = max(1, concurrency)
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.group_size = group_size or 4 * self.concurrency
        self.fingerprint = openai_fingerprint(base_url, model)
        self.thinking = thinking
        self.stats = new_stats()
        self.stats["requests"] = 0
        self._io = _ClientLoop(self.base_url, self.concurrency, self.timeout_s, self.api_key)
        weakref.finalize(self, self._io.close)  # a backend dropped without close() stops its thread too

    def generate(self, requests: list[GenerationRequest], sampling: SamplingConfig,
                 rows: RowSeeds | None = None) -> Iterator[list[Sample]]:
        """Yield the samples of each group of `group_size` turns (trajectory order, for server prefix caches).

        `rows`: turn_id -> [(sample_index, seed), ...]: instead of n=K under the turn's seed, one n=1 request per
        listed row, seeded by (seed, turn_id) as a K=1 call under that seed would be (the same request body)."""
        ordered = order_by_trajectory(requests)
        groups = [ordered[start:start + self.group_size] for start in range(0, len(ordered), self.group_size)]
        pending = None
        for i, group in enumerate(groups):
            t0 = time.perf_counter()
            pending = pending or self._submit(group, sampling, rows)
            following = self._submit(groups[i + 1], sampling, rows) if i + 1 < len(groups) else None
            results = pending.result()
            pending = following
            self.stats["wall_s"] += time.perf_counter() - t0
            yield [s for samples in results for s in samples]

    def close(self) -> None:
        """Close the session and stop the loop's thread (a later generate starts them again)."""
        self._io.close()

    def _submit(self, group: list[GenerationRequest], sampling: SamplingConfig, rows: RowSeeds | None):
        """The group's turns on the loop; a future of their samples (each turn's list, in group order)."""
        return self._io.submit(self._group(group, sampling, rows))

    async def _group(self, group: list[GenerationRequest], sampling: SamplingConfig, rows: RowSeeds | None) -> list:
        turns = [self._turn_rows(r, sampling, rows[r.turn_id]) if rows is not None else self._turn(r, sampling)
                 for r in group]
        return await asyncio.gather(*turns)

    def _body_prefix(self, req: GenerationRequest, sampling: SamplingConfig) -> str:
        """The turn's request body as JSON text without its closing brace: n and seed are appended per request."""
        body = {
            "model": self.model,
            "messages": to_openai_messages(req.messages),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_new_tokens,
        }
        if req.tools:  # the order vLLM/SGLang impose anyway and local engines render; a server that keeps ours agrees
            body["tools"] = [openai_tool_order(t) for t in req.tools]
        if self.thinking == "off":
            body["chat_template_kwargs"] = {"enable_thinking": False}
        return json.dumps(body)[:-1]

    async def _turn(self, req: GenerationRequest, sampling: SamplingConfig) -> list[Sample]:
        """K samples of one turn: ask n=K, then ask again for whatever the server did not return."""
        prefix = self._body_prefix(req, sampling)
        samples: list[Sample] = []
        while len(samples) < sampling.k:
            missing = sampling.k - len(samples)
            seed_key = req.turn_id if not samples else f"{req.turn_id}#{len(samples)}"
            samples += await self._request(req, prefix, missing, request_seed(sampling.seed, seed_key), len(samples))
        self.stats["turns"] += 1
        return samples

    async def _turn_rows(self, req: GenerationRequest, sampling: SamplingConfig,
                         row_seeds: list[tuple[int, int]]) -> list[Sample]:
        """One n=1 request per (sample_index, seed) row of the turn, concurrently."""
        prefix = self._body_prefix(req, sampling)
        replies = await asyncio.gather(*(self._request(req, prefix, 1, request_seed(seed, req.turn_id), index)
                                         for index, seed in row_seeds))
        self.stats["turns"] += 1
        return [s for reply in replies for s in reply]

    async def _request(self, req: GenerationRequest, prefix: str, n: int, seed: int, first_index: int) -> list[Sample]:
        """One request for n choices; its samples numbered from first_index."""
        reply = await self._post("/chat/completions", f'{prefix}, "n": {n}, "seed": {seed}}}', req.turn_id)
        choices = sorted(reply.get("choices") or [], key=lambda c: c.get("index", 0))
        if not choices or len(choices) > n:
            raise ServerError(f"turn {req.turn_id}: server returned {len(choices)} choices for n={n}")
        usage = reply.get("usage") or {}
        per_sample = round((usage.get("completion_tokens") or 0) / len(choices))
        self._count(usage, len(choices))
        return [Sample(turn_id=req.turn_id, sample_index=first_index + i,
                       completion=apply_thinking(choice_to_text(c.get("message") or {}, c.get("finish_reason")),
                                                 self.thinking),
                       n_prompt_tokens=int(usage.get("prompt_tokens") or 0), n_completion_tokens=per_sample,
                       finish_reason="length" if c.get("finish_reason") == "length" else "stop")
                for i, c in enumerate(choices)]

    def _count(self, usage: dict, n: int) -> None:
        # only the loop's thread updates the counters: no lock
        self.stats["requests"] += 1
        self.stats["samples"] += n
        self.stats["prompt_tokens_total"] += int(usage.get("prompt_tokens") or 0)
        self.stats["generated_tokens"] += int(usage.get("completion_tokens") or 0)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        self.stats["cache_hits"] += int(bool(cached))

    async def _post(self, path: str, body: str, turn_id: str) -> dict:
        url, data, last = self.base_url + path, body.encode(), ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                status, payload = await self._io.pool().post(path, data)
                if status == 200:
                    return json.loads(payload)
                detail = payload[:300].decode(errors="replace")
                if status not in RETRY_STATUS:
                    raise ServerError(f"turn {turn_id}: HTTP {status} from {url}: {detail}")
                last = f"HTTP {status}: {detail}"
            except (OSError, EOFError, TimeoutError, ValueError) as exc:  # ValueError: a malformed reply or JSON
                last = f"{type(exc).__name__}: {exc}"
        raise ServerError(f"turn {turn_id}: {self.max_retries + 1} attempts to {url} failed, last: {last}")


class _ClientLoop:
    """An asyncio loop in a daemon thread and its connection pool, both started on first use."""

    def __init__(self, base_url: str, concurrency: int, timeout_s: float, api_key: str | None):
        self.base_url, self.concurrency, self.timeout_s, self.api_key = base_url, concurrency, timeout_s, api_key
        self.loop: asyncio.AbstractEventLoop | None = None
        self._pool: _HttpPool | None = None

    def submit(self, coroutine):
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, name="openai-backend", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def pool(self) -> _HttpPool:
        """The pool (made on the loop's thread, the one it is used from)."""
        if self._pool is None:
            self._pool = _HttpPool(self.base_url, self.concurrency, self.timeout_s, self.api_key)
        return self._pool

    def close(self) -> None:
        if self.loop is None:
            return
        if self._pool is not None:
            asyncio.run_coroutine_threadsafe(self._pool.close(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.loop, self._pool = None, None


class _HttpPool:
    """HTTP/1.1 POSTs of JSON to one server over at most `size` kept-alive connections.

    A few lines of HTTP rather than a general client: a request is one write of prebuilt bytes and a response is its
    status line, headers and a Content-Length or chunked body, a fraction of a general client's CPU per request
    (the rollouts step sends one request per sample)."""

    def __init__(self, base_url: str, size: int, timeout_s: float, api_key: str | None):
        url = urllib.parse.urlsplit(base_url)
        self.host, self.prefix, self.timeout_s = url.hostname or "localhost", url.path, timeout_s
        self.ssl = ssl.create_default_context() if url.scheme == "https" else None
        self.port = url.port or (443 if self.ssl else 80)
        host = url.netloc.rpartition("@")[2]
        auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self.head = (f"Host: {host}\r\nContent-Type: application/json\r\nAccept: application/json\r\n{auth}"
                     "Content-Length: ")
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.slots = asyncio.Semaphore(size)

    async def post(self, path: str, data: bytes) -> tuple[int, bytes]:
        """(status, body) of one POST; a kept-alive connection the server closed meanwhile is replaced at once."""
        request = f"POST {self.prefix}{path} HTTP/1.1\r\n{self.head}{len(data)}\r\n\r\n".encode() + data
        async with self.slots:
            while self.idle:
                connection = self.idle.pop()
                try:
                    return await self._exchange(connection, request)
                except (ConnectionError, asyncio.IncompleteReadError):
                    continue  # closed by the server while idle: try the next one, then a new one
            connection = await asyncio.open_connection(self.host, self.port, ssl=self.ssl)
            return await self._exchange(connection, request)

    async def _exchange(self, connection, request: bytes) -> tuple[int, bytes]:
        reader, writer = connection
        try:
            async with asyncio.timeout(self.timeout_s):
                writer.write(request)
                status, body, keep = await _read_response(reader)
        except BaseException:
            writer.close()
            raise
        if keep:
            self.idle.append(connection)
        else:
            writer.close()
        return status, body

    async def close(self) -> None:
        for _reader, writer in self.idle:
            writer.close()
        self.idle = []


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, whether the connection stays open) of one HTTP/1.x response."""
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    version, status = lines[0].split(" ", 2)[:2]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
        await reader.readuntil(b"\r\n")  # the last chunk's line (no trailers sent by OpenAI-compatible servers)
        body = b"".join(chunks)
    else:  # the body runs to the end of the connection
        body, keep = await reader.read(), False
    return int(status), body, keep
