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
`policy.thinking: off` sends chat_template_kwargs {enable_thinking: false} (vLLM and SGLang pass it to the
template); `strip` cuts a closed thought from each completion, as the local backends do.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

from pivot_assets.core.ids import seeded_int

from .base import GenerationRequest, Sample, SamplingConfig, new_stats, order_by_trajectory
from .models import openai_tool_order, tool_call_text
from .thinking import apply_thinking

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
    """K samples per turn from an OpenAI-compatible chat server, `concurrency` requests in flight."""

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
        self._lock = threading.Lock()  # stats are updated from worker threads

    def generate(self, requests: list[GenerationRequest], sampling: SamplingConfig) -> Iterator[list[Sample]]:
        """Yield the K samples of each group of `group_size` turns (trajectory order, for server prefix caches)."""
        ordered = order_by_trajectory(requests)
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            for start in range(0, len(ordered), self.group_size):
                t0 = time.perf_counter()
                group = ordered[start : start + self.group_size]
                results = list(pool.map(lambda r: self._turn(r, sampling), group))
                self.stats["wall_s"] += time.perf_counter() - t0
                yield [s for samples in results for s in samples]

    def _body(self, req: GenerationRequest, sampling: SamplingConfig, n: int, seed_key: str) -> dict:
        body = {
            "model": self.model,
            "messages": to_openai_messages(req.messages),
            "n": n,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_new_tokens,
            "seed": request_seed(sampling.seed, seed_key),
        }
        if req.tools:  # the order vLLM/SGLang impose anyway and local engines render; a server that keeps ours agrees
            body["tools"] = [openai_tool_order(t) for t in req.tools]
        if self.thinking == "off":
            body["chat_template_kwargs"] = {"enable_thinking": False}
        return body

    def _turn(self, req: GenerationRequest, sampling: SamplingConfig) -> list[Sample]:
        """K samples of one turn: ask n=K, then ask again for whatever the server did not return."""
        samples: list[Sample] = []
        while len(samples) < sampling.k:
            missing = sampling.k - len(samples)
            seed_key = req.turn_id if not samples else f"{req.turn_id}#{len(samples)}"
            reply = self._post("/chat/completions", self._body(req, sampling, missing, seed_key), req.turn_id)
            choices = sorted(reply.get("choices") or [], key=lambda c: c.get("index", 0))
            if not choices or len(choices) > missing:
                raise ServerError(f"turn {req.turn_id}: server returned {len(choices)} choices for n={missing}")
            usage = reply.get("usage") or {}
            per_sample = round((usage.get("completion_tokens") or 0) / len(choices))
            base = len(samples)
            samples.extend([
                Sample(turn_id=req.turn_id, sample_index=base + i,
                       completion=apply_thinking(choice_to_text(c.get("message") or {}, c.get("finish_reason")),
                                                  self.thinking),
                       n_prompt_tokens=int(usage.get("prompt_tokens") or 0), n_completion_tokens=per_sample,
                       finish_reason="length" if c.get("finish_reason") == "length" else "stop")
                for i, c in enumerate(choices)])
            self._count(usage, len(choices))
        with self._lock:
            self.stats["turns"] += 1
        return samples

    def _count(self, usage: dict, n: int) -> None:
        with self._lock:
            self._count_locked(usage, n)

    def _count_locked(self, usage: dict, n: int) -> None:
        self.stats["requests"] += 1
        self.stats["samples"] += n
        self.stats["prompt_tokens_total"] += int(usage.get("prompt_tokens") or 0)
        self.stats["generated_tokens"] += int(usage.get("completion_tokens") or 0)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        self.stats["cache_hits"] += int(bool(cached))

    def _post(self, path: str, body: dict, turn_id: str) -> dict:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                req = urllib.request.Request(self.base_url + path, data=data, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:300].decode(errors="replace")
                if exc.code not in RETRY_STATUS:
                    raise ServerError(f"turn {turn_id}: HTTP {exc.code} from {self.base_url}{path}: {detail}") from None
                last = f"HTTP {exc.code}: {detail}"
            except (urllib.error.URLError, TimeoutError, ConnectionError, json.JSONDecodeError) as exc:
                last = f"{type(exc).__name__}: {exc}"
        raise ServerError(f"turn {turn_id}: {self.max_retries + 1} attempts to {self.base_url}{path} failed, last: {last}")
