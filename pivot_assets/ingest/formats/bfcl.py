"""bfcl and bfcl_multi_turn: the Berkeley Function Calling Leaderboard's items, each with its possible answer.

bfcl: single-turn items {id, question, function} (simple_python, multiple, parallel, parallel_multiple, the live_*
categories, ...): the question's messages, then one assistant message with the expected call(s) from the possible
answer (ingest/bfcl.py: the first accepted value of each argument as its arguments, every accepted value in the
call's `acceptable`); tools from `function`.
bfcl_multi_turn: multi-turn items {id, question, initial_config, involved_classes, ...} (base, miss_func,
miss_param, long_context): every ground-truth call executed by BFCL's own simulated APIs (ingest/bfcl_exec.py), one
assistant message per call followed by its result (rules in bfcl.py).
For both, the possible answer comes from `possible_answer/<the data file's name>` beside the data file, or from the
input's `answers:` (a file, or a folder of files by data file name); an item without one is quarantined
("bfcl_no_answer"). conversation_id: the item id (single-turn), the id without its category (multi-turn:
`multi_turn_7` for base_7, miss_func_7, miss_param_7 and long_context_7); domain: `bfcl_<category>` (e.g.
bfcl_simple_python, bfcl_multi_turn_base). The chat records themselves are built in ingest/bfcl_records.py.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import bfcl_records
from ..bfcl import BFCLError
from .messages import chat_messages
from .records import Origin, RecordError
from .registry import Format, register


def item_kind(value: dict) -> str | None:
    """"bfcl_multi_turn", "bfcl" or None: a BFCL item has a `question` list and an `id`; a multi-turn one names
    its `involved_classes`, a single-turn one its `function` docs."""
    if not (isinstance(value.get("question"), list) and "id" in value):
        return None
    if "involved_classes" in value:
        return "bfcl_multi_turn"
    return "bfcl" if "function" in value else None


def adapter(build: Callable[[dict, str, str | None], dict]) -> Callable[[dict, Origin], dict]:
    """The adapter of one BFCL format: `build` (a bfcl_records function) makes the chat record from the item and
    the answer beside its file."""

    def adapt_bfcl(value: dict, origin: Origin) -> dict:
        try:
            chat = build(value, origin.source, origin.answers)
        except BFCLError as err:
            raise RecordError(err.category, err.detail) from None
        return {"messages": chat_messages(chat["messages"]), "tools": chat["tools"], "reward": None,
                "domain": chat["domain"], "conversation_id": chat["conversation_id"],
                "environment": chat.get("environment")}

    return adapt_bfcl


register(Format(
    name="bfcl", description="BFCL single-turn items {id, question, function}, with their possible answer",
    keys=("function",), adapt=adapter(bfcl_records.single_turn_chat),
    detect=lambda value, file: item_kind(value) == "bfcl"))
register(Format(
    name="bfcl_multi_turn",
    description="BFCL multi-turn items {id, question, involved_classes, ...}, executed on BFCL's APIs",
    keys=("involved_classes",), adapt=adapter(bfcl_records.multi_turn_chat),
    detect=lambda value, file: item_kind(value) == "bfcl_multi_turn"))
