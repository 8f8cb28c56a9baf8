"""The embedded default input: SYNTHETIC multi-turn tool-use trajectories in OpenAI chat format.

Nothing here is real data. A toy shop ("toy_shop" domain) with five tools (JSON schemas in SHOP_TOOLS), a
scripted user and a scripted expert agent. Each trajectory is 1-2 customer tasks (each = one tool call, its
tool result, and a text reply), optionally closed by a thank-you exchange: 2-5 assistant turns.

It is built to be learnable by a tiny model after a few SFT steps (the pipeline warms SmolLM2-135M up on
it), so that profiling finds turns with mixed outcomes: a short system prompt, a few phrasing templates per
task, and every argument (order id, product id, query, reason, count) appears verbatim in the user message.
`outcome_reward` is a synthetic label (1.0 for about 80% of trajectories, seeded), not a measured outcome.
Deterministic: the same (n, seed) always gives the same records.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

DOMAIN = "toy_shop"
DEFAULT_N = 60
SYSTEM_PROMPT = "You are the assistant of a toy shop. Use the tools to help the customer, then answer briefly."


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


_ORDER_ID = {"type": "string", "description": "Order id, like ORD-1234."}
_PRODUCT_ID = {"type": "string", "description": "Product id, like P-123."}
SHOP_TOOLS = [
    _tool("get_order_status", "Get the status and delivery date of an order.", {"order_id": _ORDER_ID}, ["order_id"]),
    _tool("cancel_order", "Cancel an order that has not shipped yet.",
          {"order_id": _ORDER_ID, "reason": {"type": "string", "description": "Why the customer cancels."}},
          ["order_id", "reason"]),
    _tool("search_products", "Search the catalog.",
          {"query": {"type": "string", "description": "What to search for."},
           "max_results": {"type": "integer", "description": "How many results (default 3)."}}, ["query"]),
    _tool("get_product_details", "Get price and stock of a product.", {"product_id": _PRODUCT_ID}, ["product_id"]),
    _tool("track_shipment", "Get the carrier and tracking number of a shipped order.", {"order_id": _ORDER_ID},
          ["order_id"]),
]

QUERIES = ["wooden trains", "puzzles", "teddy bears", "kites", "board games", "toy cars", "dolls", "lego sets"]
REASONS = ["ordered by mistake", "found a better price", "it arrives too late", "bought it elsewhere"]
STATUSES = ["processing", "shipped", "delivered"]
CARRIERS = ["DHL", "UPS", "FedEx"]
ADJECTIVES = ["Classic", "Deluxe", "Mini", "Super", "Happy"]

STATUS_ASKS = ["What is the status of order {oid}?", "Can you check order {oid} for me?", "Where is my order {oid}?"]
CANCEL_ASKS = ["Please cancel order {oid}, {reason}.", "I want to cancel order {oid} because {reason}."]
SEARCH_ASKS = ["I am looking for {query}.", "Do you sell {query}?"]
SEARCH_N_ASKS = ["Show me {n} options for {query}.", "Find {n} {query} please."]
DETAIL_ASKS = ["Tell me more about product {pid}.", "How much is {pid}?"]
TRACK_ASKS = ["Can you track order {oid}?", "Which carrier has my order {oid}?"]
OPENERS = ["Hi! ", "Hello. ", ""]
CLOSINGS = [("Thanks, that's all.", "You're welcome! Have a nice day."),
            ("Great, thank you!", "Glad I could help. Goodbye!")]


class _Script:
    """Builds one trajectory's messages; call ids are call_<trajectory>_<k>."""

    def __init__(self, rng: random.Random, index: int):
        self.rng, self.index = rng, index
        self.messages: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT}]
        self.n_calls = 0
        self.last_products: list[str] = []

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def call(self, name: str, arguments: dict, result: dict) -> None:
        call_id = f"call_{self.index}_{self.n_calls}"
        self.n_calls += 1
        self.messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]})
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)})

    def reply(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def order_id(self) -> str:
        return f"ORD-{self.rng.randint(1000, 9999)}"

    def product_id(self) -> str:
        return f"P-{self.rng.randint(100, 999)}"


def _task_status(s: _Script, opener: str) -> None:
    oid, status = s.order_id(), s.rng.choice(STATUSES)
    day = f"2024-06-{s.rng.randint(1, 28):02d}"
    s.user(opener + s.rng.choice(STATUS_ASKS).format(oid=oid))
    s.call("get_order_status", {"order_id": oid}, {"order_id": oid, "status": status, "delivery_date": day})
    s.reply(f"Order {oid} is {status}. Delivery date: {day}.")


def _task_cancel(s: _Script, opener: str) -> None:
    oid, reason = s.order_id(), s.rng.choice(REASONS)
    s.user(opener + s.rng.choice(CANCEL_ASKS).format(oid=oid, reason=reason))
    s.call("cancel_order", {"order_id": oid, "reason": reason}, {"order_id": oid, "cancelled": True})
    s.reply(f"Order {oid} is cancelled. You will get a refund in 5 days.")


def _task_search(s: _Script, opener: str) -> None:
    query = s.rng.choice(QUERIES)
    n = s.rng.choice([None, 2, 3])
    args = {"query": query} if n is None else {"query": query, "max_results": n}
    if n is None:
        s.user(opener + s.rng.choice(SEARCH_ASKS).format(query=query))
    else:
        s.user(opener + s.rng.choice(SEARCH_N_ASKS).format(query=query, n=n))
    found = [{"product_id": s.product_id(), "name": f"{s.rng.choice(ADJECTIVES)} {query}"} for _ in range(n or 3)]
    s.last_products = [p["product_id"] for p in found]
    s.call("search_products", args, {"results": found})
    listing = ", ".join(f"{p['name']} ({p['product_id']})" for p in found)
    s.reply(f"I found: {listing}.")


def _task_details(s: _Script, opener: str) -> None:
    pid = s.rng.choice(s.last_products) if s.last_products else s.product_id()
    price, stock = s.rng.randint(5, 80), s.rng.randint(0, 20)
    s.user(opener + s.rng.choice(DETAIL_ASKS).format(pid=pid))
    s.call("get_product_details", {"product_id": pid}, {"product_id": pid, "price": price, "in_stock": stock})
    s.reply(f"Product {pid} costs ${price}." + (f" {stock} in stock." if stock else " It is out of stock."))


def _task_track(s: _Script, opener: str) -> None:
    oid, carrier = s.order_id(), s.rng.choice(CARRIERS)
    number = f"{carrier[:2].upper()}{s.rng.randint(100000, 999999)}"
    s.user(opener + s.rng.choice(TRACK_ASKS).format(oid=oid))
    s.call("track_shipment", {"order_id": oid}, {"order_id": oid, "carrier": carrier, "tracking_number": number})
    s.reply(f"Order {oid} ships with {carrier}, tracking number {number}.")


TASKS = [_task_status, _task_cancel, _task_search, _task_details, _task_track]


def iter_trajectories(n: int = DEFAULT_N, seed: int = 0) -> Iterator[dict]:
    """`n` synthetic toy-shop trajectories (OpenAI chat records: id, domain, messages, tools, reward), one at a
    time: a large sample is written without holding it."""
    rng = random.Random(seed)
    for i in range(n):
        s = _Script(rng, i)
        tasks = [rng.choice(TASKS)]
        if rng.random() < 0.5:
            # a search is naturally followed by a question about one of the found products
            tasks.append(_task_details if tasks[0] is _task_search else rng.choice(TASKS))
        for k, task in enumerate(tasks):
            task(s, rng.choice(OPENERS) if k == 0 else "")
        if rng.random() < 0.6:
            ask, answer = rng.choice(CLOSINGS)
            s.user(ask)
            s.reply(answer)
        yield {"id": f"toy-shop-{seed}-{i:04d}", "domain": DOMAIN, "messages": s.messages,
               "tools": SHOP_TOOLS, "reward": 1.0 if rng.random() < 0.8 else 0.0}


def generate_trajectories(n: int = DEFAULT_N, seed: int = 0) -> list[dict]:
    """iter_trajectories(n, seed) as a list."""
    return list(iter_trajectories(n, seed))


def write_sample(path: str | Path, n: int = DEFAULT_N, seed: int = 0) -> Path:
    """Write iter_trajectories(n, seed) as JSONL to `path` (parents created, written whole or not at all);
    returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for record in iter_trajectories(n, seed):
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path
