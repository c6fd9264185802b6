"""Help text where people read it, generated from the ``Field(description=…)`` texts of the params models.

- :func:`explain` answers ``python -m mimesis_lab.config --explain agent_rl.lr``: type, constraints,
  default and description of one dotted key (shared-group keys included).
- :func:`annotate` rewrites a params YAML with a ``#:`` comment above every key (its description
  and default), keeping values, order and hand-written ``#`` comments: ``python -m
  mimesis_lab.config --annotate params.yaml``. ``#:`` lines are regenerated on every run, so edit a
  description in the model, never the comment. Keys below a mapping of free names (the globs of
  ``role_swap.mixture``, the tasks of ``sim_rl.tasks``) get no comment: their parent has one.

The functions take a :class:`~mimesis_lab.config_base.Schema` (the root model and its shared groups),
so this module does not import :mod:`mimesis_lab.config`; that module passes its own.
"""
from __future__ import annotations

import re
import textwrap
from types import NoneType, UnionType
from typing import Any, Literal, NamedTuple, Sequence, Union, get_args, get_origin

import yaml
from annotated_types import Ge, Gt, Le, Lt, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from mimesis_lab.config_base import Schema, section_model

__all__ = ["KeyDoc", "key_doc", "explain", "key_lines", "annotate"]

MARK = "#:"          # generated comment lines start with this; hand-written ones with a plain "#"
WIDTH = 110          # comment lines are wrapped to this many columns
MAX_DEFAULT = 60     # longer defaults (whole mappings) are left to --explain
REQUIRED = "(required)"


class KeyDoc(NamedTuple):
    """What a dotted key is. ``field`` is None for a shared group's own key and for a free name (a glob
    of ``role_swap.mixture``, a task of ``sim_rl.tasks``); ``below_free`` marks such a name and every
    key under it: their parent's comment covers them."""

    key: str
    field: FieldInfo | None
    model: type[BaseModel] | None     # the section the key opens (None for a plain value)
    description: str
    group: str | None = None          # the shared group the key is written in, or may be
    below_free: bool = False
    default: Any = REQUIRED           # the value when the key is left out (within its parent's default)


def _free_values(annotation: Any) -> Any | None:
    """The value type of a mapping of free names (``dict[str, X]``, possibly ``| None``), else None."""
    if get_origin(annotation) in (Union, UnionType):
        found = [v for v in map(_free_values, get_args(annotation)) if v is not None]
        return found[0] if found else None
    return get_args(annotation)[1] if get_origin(annotation) is dict else None


def _field(model: type[BaseModel] | None, name: str) -> FieldInfo | None:
    return _named_field(model, name)[1]


def _named_field(model: type[BaseModel] | None, name: str) -> tuple[str, FieldInfo | None]:
    """(attribute name, field) of the key ``name`` (an attribute name or an alias)."""
    for attr, f in (model.model_fields.items() if model is not None else ()):
        if name in (attr, f.alias):
            return attr, f
    return name, None


def _own_default(field: FieldInfo) -> Any:
    return REQUIRED if field.is_required() else field.get_default(call_default_factory=True)


def _keys(schema: Schema, doc: KeyDoc) -> list[str]:
    """The keys a section may hold (a shared group: its members' shared keys)."""
    if doc.model is None:
        return []
    if doc.field is None and doc.key in schema.groups:
        return [n for n in doc.model.model_fields if n not in schema.per_phase_keys
                and all(_field(schema.section(m), n) for m in schema.groups[doc.key].members)]
    return [f.alias or n for n, f in doc.model.model_fields.items()]


def key_doc(key: str | Sequence[str], schema: Schema) -> KeyDoc:
    """The :class:`KeyDoc` of a dotted ``key`` (or its parts, when a free name holds a dot);
    :class:`KeyError` names the first unknown part."""
    head, *rest = key.split(".") if isinstance(key, str) else key
    if head in schema.groups:
        doc = KeyDoc(head, None, schema.section(head), schema.groups[head].description, head)
    else:
        f = _field(schema.root, head)
        if f is None:
            raise KeyError(f"unknown section `{head}`; sections: {', '.join(_names(schema))}")
        doc = KeyDoc(head, f, section_model(f.annotation), f.description or "", default=_own_default(f))
    phase_group = next((n for n, g in schema.groups.items() if head in g.members), None)
    free_of = None                     # the value type while a free name comes next
    for i, part in enumerate(rest):
        here = ".".join([head, *rest[:i + 1]])
        if free_of is not None:
            doc, free_of = KeyDoc(here, None, section_model(free_of), "", doc.group, True), None
            continue
        if i == 0 and head in schema.groups and part in schema.per_phase_keys:
            raise KeyError(f"`{here}`: {part} is written in each phase section "
                           f"({', '.join(schema.groups[head].members)}), not in the shared group")
        keys = _keys(schema, doc)
        if part not in keys:
            raise KeyError(f"unknown key `{here}`" + (f"; keys of `{doc.key}`: {', '.join(keys)}" if keys else ""))
        attr, f = _named_field(doc.model, part)
        # a sub-section's default (OpenAIEndpoint(model="judge")) sets its keys' defaults
        default = getattr(doc.default, attr) if isinstance(doc.default, BaseModel) else _own_default(f)
        group = doc.group
        if i == 0 and phase_group and part in _keys(schema, key_doc(phase_group, schema)):
            group = phase_group        # a shared key, written in the group unless the phase overrides it
        doc = KeyDoc(here, f, section_model(f.annotation), f.description or "", group, doc.below_free, default)
        free_of = _free_values(f.annotation)
    return doc


def _names(schema: Schema) -> list[str]:
    return [*(f.alias or n for n, f in schema.root.model_fields.items()), *schema.groups]


def _type_str(annotation: Any) -> str:
    if annotation is NoneType:
        return "null"
    if get_origin(annotation) is Literal:
        return " | ".join(str(a) for a in get_args(annotation))
    if get_origin(annotation) in (Union, UnionType):
        return " | ".join(_type_str(a) for a in get_args(annotation))
    if get_origin(annotation) is dict:
        k, v = get_args(annotation)
        return f"mapping {_type_str(k)} -> {_type_str(v)}"
    if get_origin(annotation) is list:
        return f"list of {_type_str(get_args(annotation)[0])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"section ({annotation.__name__})"
    return getattr(annotation, "__name__", str(annotation))


def _constraints(field: FieldInfo) -> str:
    out = []
    for m in field.metadata:
        for cls, attr, op in ((Gt, "gt", ">"), (Ge, "ge", ">="), (Lt, "lt", "<"), (Le, "le", "<=")):
            if isinstance(m, cls):
                out.append(f"{op} {getattr(m, attr)}")
        if isinstance(m, MinLen):
            out.append(f"at least {m.min_length} item(s)")
    return ", ".join(out)


def _yaml(value: Any) -> str:
    text = yaml.safe_dump(to_jsonable_python(value, by_alias=True), default_flow_style=True, width=10**6,
                          sort_keys=False).strip()
    return text[:-len("...")].strip() if text.endswith("...") else text


def _default(doc: KeyDoc) -> str:
    """The default as YAML, or ``(required)``."""
    return REQUIRED if doc.default is REQUIRED else _yaml(doc.default)


def explain(key: str, schema: Schema) -> str:
    """Type, constraints, default and description of ``key`` (a section lists its keys)."""
    doc = key_doc(key, schema)
    lines = [doc.key]
    if doc.field is None and not doc.below_free:
        members = schema.groups[doc.key].members
        lines.append(f"  shared group, merged under {', '.join(members)} (a phase section may override its keys)")
    elif doc.field is None:
        lines.append("  a free name (its parent says what it names)")
    if doc.field is not None:
        cons = _constraints(doc.field)
        lines.append(f"  type:    {_type_str(doc.field.annotation)}" + (f" ({cons})" if cons else ""))
        if doc.model is None:          # a section's default is its keys' defaults
            lines.append(f"  default: {_default(doc)}")
    if doc.group and doc.field is not None:
        members = ", ".join(schema.groups[doc.group].members)
        where = key if key.startswith(doc.group + ".") else f"{doc.group}.{key.split('.', 1)[1]}"
        lines.append(f"  shared:  written once as {where} for {members}; a phase section may override it")
    if doc.description:
        lines += ["", textwrap.indent(textwrap.fill(doc.description, WIDTH - 2), "  ")]
    if _keys(schema, doc):
        lines += ["", textwrap.fill(f"keys: {', '.join(_keys(schema, doc))}", WIDTH, initial_indent="  ",
                                    subsequent_indent="        ")]
    return "\n".join(lines)


_KEY = re.compile(r"""^(?P<indent> *)(?P<key>"[^"]*"|'[^']*'|[^\s#'"{}\[\],&*!|>%@`-][^:#]*?)\s*:(?:\s|$)""")


def _brackets(line: str) -> int:
    """Net ``{[`` minus ``]}`` outside quotes and comments (for flow collections spanning lines)."""
    depth, quote = 0, None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "\"'":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            break
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
    return depth


def key_lines(text: str, schema: Schema) -> list[tuple[int, KeyDoc]]:
    """``(line index, KeyDoc)`` of every key line of a params YAML in block style, in order.
    A section written in flow style (``openai: {base_url: …}``) is refused: its keys could not
    carry their comments (a mapping of free names may be written either way)."""
    out: list[tuple[int, KeyDoc]] = []
    stack: list[tuple[int, str]] = []            # (indent, key) of the open block mappings
    depth = 0
    for n, line in enumerate(text.splitlines()):
        if depth:                                # inside a flow collection that spans lines
            depth += _brackets(line)
            continue
        m = _KEY.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent, key = len(m["indent"]), m["key"].strip("\"'")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        doc = key_doc([k for _, k in stack], schema)
        rest = line[m.end():].lstrip()
        if rest.startswith("{") and doc.model is not None and not doc.below_free:
            raise ValueError(f"line {n + 1}: section `{doc.key}` is written in flow style; write it in block "
                             "style so that each of its keys carries its comment")
        depth = _brackets(line)
        out.append((n, doc))
    return out


def _comment(doc: KeyDoc, indent: int) -> list[str]:
    text = doc.description
    if doc.field is not None and doc.model is None:
        default = _default(doc)
        if default is REQUIRED:
            text += f" {REQUIRED}"
        elif len(default) <= MAX_DEFAULT:
            text += f" (default: {default})"
    wrap = textwrap.wrap(text, WIDTH - indent - len(MARK) - 1, break_on_hyphens=False)
    return [f"{' ' * indent}{MARK} {w}" for w in wrap]


def annotate(text: str, schema: Schema) -> str:
    """``text`` with a fresh ``#:`` comment above every key (keys below free names excepted); old
    ``#:`` lines are dropped, everything else is kept. The values are checked to be unchanged."""
    kept = [line for line in text.splitlines() if not line.lstrip().startswith(MARK)]
    docs = dict(key_lines("\n".join(kept), schema))
    out = []
    for n, line in enumerate(kept):
        doc = docs.get(n)
        if doc is not None and not doc.below_free:
            out += _comment(doc, len(line) - len(line.lstrip(" ")))
        out.append(line)
    new = "\n".join(out) + ("\n" if text.endswith("\n") else "")
    if yaml.safe_load(new) != yaml.safe_load(text):
        raise AssertionError("annotate changed a value; this is a bug in mimesis_lab.config_help")
    return new
