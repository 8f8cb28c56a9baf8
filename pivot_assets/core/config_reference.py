"""pivot.yaml's JSON Schema and the Markdown reference generated from it (`pivot config --schema / --reference`).

The schema is PivotConfig's, with the defaults of factory-built fields filled in (pydantic leaves them out), so an
editor shows every default. The reference walks the schema section by section: one table of field, type, default
and description per section, in declaration order; docs/configuration.md is its output.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic.json_schema import GenerateJsonSchema

from pivot_assets.core.config import PivotConfig

REGENERATE = "pivot config --reference > docs/configuration.md"
SCHEMA_FILE = "pivot.schema.json"


class _WithFactoryDefaults(GenerateJsonSchema):
    """Also write the default of a `default_factory` field (the value a config that omits it gets)."""

    def default_schema(self, schema):
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            schema = {**schema, "default": factory()}
            schema.pop("default_factory")
        return super().default_schema(schema)


def config_schema() -> dict:
    """pivot.yaml's JSON Schema (draft 2020-12), every field with its default."""
    return PivotConfig.model_json_schema(schema_generator=_WithFactoryDefaults)


def schema_fields(schema: dict) -> list[tuple[str, dict]]:
    """(model name, property schema) of every field of every section."""
    models = {"PivotConfig": schema, **schema.get("$defs", {})}
    return [(name, prop) for name, model in models.items() for prop in model.get("properties", {}).values()]


def reference_markdown(schema: dict | None = None) -> str:
    """The configuration reference as Markdown: a header, then one section per object in the schema."""
    schema = schema or config_schema()
    lines = [
        "# Configuration reference",
        "",
        f"Generated from pivot.yaml's JSON Schema: regenerate with `{REGENERATE}`. Editors complete and check "
        f"pivot.yaml from the schema: `pivot config --schema > {SCHEMA_FILE}`, then make "
        f"`# yaml-language-server: $schema={SCHEMA_FILE}` pivot.yaml's first line (VS Code's YAML extension and "
        "other yaml-language-server clients read it).",
        "",
    ]
    sections, paths = _sections(schema)
    for path, model in sections:
        lines += _section(path, model, paths, schema)
    return "\n".join(lines).rstrip() + "\n"


def _sections(schema: dict) -> tuple[list[tuple[str, dict]], dict[str, str]]:
    """(key path, object schema) of the top level and every nested section, depth first, each model once, and
    {$ref: the key path it is documented under} (a shape used again, such as the verifier's, points there)."""
    out: list[tuple[str, dict]] = []
    seen: dict[str, str] = {}

    def walk(path: str, model: dict) -> None:
        out.append((path, model))
        for key, prop in model.get("properties", {}).items():
            ref = _section_ref(prop)
            if ref and ref not in seen:
                seen[ref] = _join(path, key, prop)
                walk(seen[ref], _resolve(schema, ref))

    walk("", schema)
    return out, seen


def _join(path: str, key: str, prop: dict) -> str:
    key = f"{key}[]" if _is_list(prop) else key
    return f"{path}.{key}" if path else key


def _is_list(prop: dict) -> bool:
    return any(p.get("type") == "array" for p in [prop, *prop.get("anyOf", [])])


def _section_ref(prop: dict) -> str | None:
    """The $ref of the object a property holds (directly, optionally, or as list items), if any."""
    for p in [prop, *prop.get("anyOf", [])]:
        if "$ref" in p:
            return p["$ref"]
        if p.get("type") == "array" and "$ref" in p.get("items", {}):
            return p["items"]["$ref"]
    return None


def _resolve(schema: dict, ref: str) -> dict:
    return schema["$defs"][ref.rsplit("/", 1)[-1]]


def _section(path: str, model: dict, paths: dict[str, str], schema: dict) -> list[str]:
    title = f"`{path}`" if path else "Top level"
    lines = [f"## {title}", ""]
    if path and model.get("description"):
        lines += [_one_line(model["description"]), ""]
    lines += ["| Field | Type | Default | Description |", "| --- | --- | --- | --- |"]
    required = set(model.get("required", []))
    for key, prop in model.get("properties", {}).items():
        default = "required" if key in required else _default(prop, schema)
        lines.append(f"| `{key}` | {_cell(_type(prop, paths))} | {_cell(default)} | {_cell(prop.get('description', ''))} |")
    return lines + [""]


def _default(prop: dict, schema: dict) -> str:
    """The default as JSON; a section's own defaults are in its table, so only a section default that differs
    from them (e.g. ablation.exact_verifier's) is written out."""
    if "default" not in prop:
        return ""
    ref, default = _section_ref(prop), prop["default"]
    if ref and isinstance(default, dict):
        own = {k: p.get("default") for k, p in _resolve(schema, ref).get("properties", {}).items()}
        if all(own.get(k) == v for k, v in default.items()):
            return "see its section"
    return f"`{json.dumps(default)}`"


def _type(prop: dict, paths: dict[str, str]) -> str:
    if "$ref" in prop:
        return f"section `{paths[prop['$ref']]}`"
    if "enum" in prop:
        return " | ".join(json.dumps(v) for v in prop["enum"])
    if "const" in prop:
        return json.dumps(prop["const"])
    if "anyOf" in prop:
        return " | ".join(_type(p, paths) for p in prop["anyOf"])
    kind = prop.get("type")
    if kind == "array":
        return f"list[{_type(prop.get('items', {}), paths)}]" + _bounds(prop)
    if kind == "object":
        values = prop.get("additionalProperties")
        return f"map[str, {_type(values, paths)}]" if isinstance(values, dict) else "map"
    names = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "null"}
    return names.get(kind, "any") + _bounds(prop)


def _bounds(prop: dict) -> str:
    marks = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"),
             ("minItems", "items >="))
    bounds = [f"{sign} {prop[key]}" for key, sign in marks if key in prop]
    return f" ({', '.join(bounds)})" if bounds else ""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cell(text: Any) -> str:
    """Table-safe: one line, pipes escaped, angle brackets as entities (Markdown would read <x> as HTML)."""
    return _one_line(str(text)).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
