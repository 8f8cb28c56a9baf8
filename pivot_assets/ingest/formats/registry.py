"""The input formats, by name: each format's module registers one `Format` (or two), and everything that asks
"which format is this record" or "is this a format" asks here (format=auto detection, a forced format's check,
the config's `inputs[].format`, the JSON-text columns parsed before detection)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .records import Origin

AUTO = "auto"  # not a format: detect each record's


@dataclass(frozen=True)
class Format:
    """One input format: which records are this format, and how one becomes canonical messages.

    `adapt(record, origin)` returns {messages (canonical, unvalidated: messages.chat_messages builds them), tools,
    reward, domain} and optionally conversation_id and environment; it raises RecordError for a record it cannot
    use (the quarantine reason)."""

    name: str
    description: str  # one line: what its records look like (the config reference lists it)
    keys: tuple[str, ...]  # a record holding any of these fits the format when an input forces it
    adapt: Callable[[dict, Origin], dict]
    # format=auto: does this record (in a file whose other fields are `file`, or None) look like this format?
    # None: it holds one of `keys`
    detect: Callable[[dict, dict | None], bool] | None = None
    json_keys: tuple[str, ...] = ()  # fields Parquet / HF datasets may hold as JSON text: parsed before detection
    generic: bool = False  # asked last by detection: its keys are other formats' too (openai's `messages`)

    def fits(self, record: dict) -> bool:
        return any(key in record for key in self.keys)

    def detects(self, record: dict, file: dict | None) -> bool:
        return self.detect(record, file) if self.detect else self.fits(record)

    @property
    def module(self) -> str:
        return self.adapt.__module__


_FORMATS: dict[str, Format] = {}  # in registration order: the config's order, and detection's (generic last)


def register(fmt: Format) -> Format:
    """Add a format (a module registers its own on import; registering it again, e.g. on a reload, replaces it)."""
    existing = _FORMATS.get(fmt.name)
    if fmt.name == AUTO or (existing is not None and existing.module != fmt.module):
        owner = "reserved" if fmt.name == AUTO else f"registered by {existing.module}"
        raise ValueError(f"input format {fmt.name!r} is {owner}")
    _FORMATS[fmt.name] = fmt
    return fmt


def unregister(name: str) -> None:
    _FORMATS.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(_FORMATS)


def get(name: str) -> Format:
    return _FORMATS[name]


def detect(record: dict, file: dict | None = None) -> str | None:
    """The name of the first format that detects the record (the generic ones last), or None."""
    ordered = sorted(_FORMATS.values(), key=lambda f: f.generic)  # stable: registration order otherwise
    return next((f.name for f in ordered if f.detects(record, file)), None)


def json_keys() -> tuple[str, ...]:
    """Every format's JSON-text fields, once each, in registration order."""
    return tuple(dict.fromkeys(key for f in _FORMATS.values() for key in f.json_keys))


def describe() -> str:
    """One line per format, "`name`: description" (the config's `inputs[].format` description)."""
    return "; ".join(f"`{f.name}`: {f.description}" for f in _FORMATS.values())


def outside_modules() -> tuple[str, ...]:
    """The modules of the formats registered from outside this package (a spawned ingest worker imports them)."""
    return tuple(dict.fromkeys(f.module for f in _FORMATS.values() if not f.module.startswith(__package__ + ".")))


def load(modules: Iterable[str]) -> None:
    """Import format modules (each registers its formats); an imported one is not imported again."""
    for module in modules:
        importlib.import_module(module)
