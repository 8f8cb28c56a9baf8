"""BFCL items -> OpenAI chat records (messages, tools, domain, conversation_id), Dagster-free.

ingest/formats/ adapts the chat record like any other (the `bfcl` and `bfcl_multi_turn` formats); this module holds
the BFCL rules:
  - the answer of an item is the record with its id in the possible-answer file: `possible_answer/<the data
    file's name>` beside the data file (compressed or not), or the input's `answers:` (a file, or a folder holding
    the file by the data file's name); an item with none is "bfcl_no_answer" (BFCL's irrelevance categories have
    no possible answers: their items are quarantined, never dropped);
  - single-turn: the question's messages, then one assistant message with the expected call(s) (bfcl.expected_
    action: arguments = the first accepted value of each argument, `acceptable` = every accepted value); tools
    from the item's `function`;
  - multi-turn: turn by turn, the turn's user message(s), then every ground-truth call of the turn executed on
    the conversation's simulated APIs (bfcl_exec.Session), each as one assistant message holding that call and
    a tool message holding its result. A turn whose answer is empty (BFCL expects no call there: miss_param's
    turns before the user gives the missing value, miss_func's turns before the function is added) adds no
    assistant message: BFCL has no expert text for it. Tools: the function docs (multi_turn_func_doc/ beside the
    data file, else bfcl-eval's own) of the involved classes, minus `excluded_function` and minus the functions
    miss_func holds back. A trajectory has one tool list, so a held-back function is announced where BFCL adds
    it: BFCL's turn for it has no user message, and BFCL sends "I have updated some more functions you can choose
    from. What about now?" there; our user message at that point holds the added functions' tool schemas as JSON
    on its first line, then that sentence (BFCL's prompting-mode message for the same turn);
  - multi-turn environment: {kind: bfcl_multi_turn, involved_classes, initial_config, long_context}
    (environments/bfcl.py), kept as the trajectory's `environment`, so a verifier can rebuild the world at any
    step (the expert's earlier calls are the trajectory's own messages);
  - domain `bfcl_<category>` (the id without its index); conversation_id: the item id (single-turn), the id
    without its category (multi-turn: base_7, miss_func_7, miss_param_7 and long_context_7 are variants of one
    conversation and share `multi_turn_7`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import files
from .bfcl import BFCLError, bfcl_tools, expected_action
from .bfcl_exec import Session, backend

ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"  # BFCL's


def category(item_id: str) -> str:
    """`simple_python` for simple_python_12, `live_simple` for live_simple_3-2-1, `multi_turn_base` for ..._7."""
    return item_id.rsplit("_", 1)[0]


# ---------------------------------------------------------------------------------------------- answers


def answers_file(source: str, answers: str | None = None) -> Path | None:
    """The possible-answer file of data file `source` (module docstring), or None."""
    data = Path(source)
    if answers is not None and Path(answers).is_file():
        return Path(answers)
    folder = Path(answers) if answers is not None else data.parent / "possible_answer"
    stem = data.name[: -len(data.suffix)] if files.compression(data) else data.name
    for name in dict.fromkeys((data.name, stem, stem + ".gz", stem + ".zst", stem + ".zstd")):
        if (folder / name).is_file():
            return folder / name
    return None


@lru_cache(maxsize=64)
def _answers(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    try:
        records = files.read_records(Path(path))
    except (OSError, ValueError) as exc:
        raise BFCLError(f"bfcl_no_answer: possible answers unreadable: {exc}") from None
    return {r["id"]: r.get("ground_truth") for r in records if isinstance(r, dict) and isinstance(r.get("id"), str)}


def ground_truth(item_id: str, source: str, answers: str | None = None) -> Any:
    """The item's ground truth from its possible-answer file; BFCLError "bfcl_no_answer" when there is none."""
    path = answers_file(source, answers)
    if path is None:
        where = answers if answers is not None else Path(source).parent / "possible_answer"
        raise BFCLError(f"bfcl_no_answer: no possible answers for {Path(source).name} in {where} "
                        "(BFCL ships none for some categories, e.g. irrelevance)")
    stat = path.stat()
    by_id = _answers(str(path), stat.st_mtime_ns, stat.st_size)
    if item_id not in by_id:
        raise BFCLError(f"bfcl_no_answer: {item_id} is not in {path}")
    return by_id[item_id]


# ---------------------------------------------------------------------------------------------- items


def _item_id(item: dict) -> str:
    if not isinstance(item.get("id"), str) or not item["id"]:
        raise BFCLError("bfcl_item: the item has no string id")
    return item["id"]


def _turns(item: dict) -> list[list[dict]]:
    question = item.get("question")
    if not isinstance(question, list) or not all(isinstance(t, list) for t in question):
        raise BFCLError("bfcl_item: question is not a list of turns (lists of messages)")
    return question


def single_turn_chat(item: dict, source: str, answers: str | None = None) -> dict:
    """A single-turn BFCL item -> a chat record (module docstring)."""
    item_id = _item_id(item)
    functions = item.get("function")
    if not isinstance(functions, list):
        raise BFCLError("bfcl_item: function is not a list of function docs")
    action = expected_action(ground_truth(item_id, source, answers))
    calls = action["calls"] if action["type"] == "function_call_batch" else [action]
    expected = {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}, "acceptable": c["acceptable"]}
        for c in calls]}
    return {"messages": [m for turn in _turns(item) for m in turn] + [expected], "tools": bfcl_tools(functions),
            "domain": f"bfcl_{category(item_id)}", "conversation_id": item_id}


def multi_turn_chat(item: dict, source: str, answers: str | None = None) -> dict:
    """A multi-turn BFCL item -> a chat record, its calls executed by BFCL's simulated APIs (module docstring)."""
    item_id = _item_id(item)
    turns = _turns(item)
    truth = ground_truth(item_id, source, answers)
    if not isinstance(truth, list) or not all(isinstance(t, list) and all(isinstance(c, str) for c in t) for t in truth):
        raise BFCLError("bfcl_answer: the ground truth is not a list of turns of call strings "
                        "(an agentic category, whose answer is text, has no calls to execute)")
    if len(truth) != len(turns):
        raise BFCLError(f"bfcl_answer: {len(turns)} question turns but {len(truth)} answer turns")
    classes = item.get("involved_classes")
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise BFCLError("bfcl_item: involved_classes is not a list of class names")
    docs = [doc for name in classes for doc in function_docs(name, source)]
    by_name = {doc.get("name"): doc for doc in docs}
    held = _held_back(item.get("missed_function"), by_name)
    hidden = set(item.get("excluded_function") or []) | {name for names in held.values() for name in names}
    session = Session(classes, item.get("initial_config") or {}, long_context="long_context" in category(item_id))
    messages: list[dict] = []
    for t, (question, calls) in enumerate(zip(turns, truth)):
        if t in held:
            if question:
                raise BFCLError(f"bfcl_item: turn {t} adds functions but also holds a user message")
            added = bfcl_tools([by_name[name] for name in held[t]])
            messages.append({"role": "user", "content": json.dumps(added, ensure_ascii=False) + "\n" + ADDED_FUNCTIONS_PROMPT})
        else:
            messages.extend(question)
        for k, text in enumerate(calls):
            try:
                name, arguments, result = session.call(text)
            except BFCLError as exc:
                raise BFCLError(f"{exc.category}: turn {t} call {k}: {exc.detail}") from None
            messages.append({"role": "assistant", "content": None,
                             "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]})
            messages.append({"role": "tool", "content": result})
    index = item_id.rsplit("_", 1)[-1]
    return {"messages": messages, "tools": bfcl_tools([d for d in docs if d.get("name") not in hidden]),
            "domain": f"bfcl_{category(item_id)}", "conversation_id": f"multi_turn_{index}",
            "environment": session.environment}


def _held_back(missed: Any, by_name: dict) -> dict[int, list[str]]:
    """miss_func's {turn index: [function names]} (turn keys are strings in the data), checked."""
    if not missed:
        return {}
    if not isinstance(missed, dict):
        raise BFCLError("bfcl_item: missed_function is not a mapping of turn -> function names")
    held = {}
    for turn, names in missed.items():
        if not str(turn).isdigit() or not isinstance(names, list):
            raise BFCLError(f"bfcl_item: missed_function has an entry {turn!r}: {names!r}")
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise BFCLError(f"bfcl_item: missed_function names {unknown[0]!r}, which no involved class documents")
        held[int(turn)] = names
    return held


# ---------------------------------------------------------------------------------------------- function docs


def function_docs(class_name: str, source: str) -> list[dict]:
    """BFCL's function docs of one involved class: multi_turn_func_doc/ beside the data file, else bfcl-eval's."""
    file_name = backend().MULTI_TURN_FUNC_DOC_FILE_MAPPING.get(class_name)
    if file_name is None:
        raise BFCLError(f"bfcl_item: unknown involved class {class_name!r}")
    for folder in (Path(source).parent / "multi_turn_func_doc", _package_docs()):
        path = folder / file_name
        if path.is_file():
            stat = path.stat()
            return _docs(str(path), stat.st_mtime_ns, stat.st_size)
    raise BFCLError(f"bfcl_unavailable: no function docs {file_name} beside the data or in bfcl-eval")


def _package_docs() -> Path:
    import bfcl_eval

    return Path(bfcl_eval.__file__).parent / "data" / "multi_turn_func_doc"


@lru_cache(maxsize=64)
def _docs(path: str, mtime_ns: int, size: int) -> list[dict]:
    try:
        return files.read_records(Path(path))
    except (OSError, ValueError) as exc:
        raise BFCLError(f"bfcl_unavailable: function docs unreadable: {exc}") from None
