"""Shared groups of ``params.yaml``: a group is written once and merged under each of its member phase
sections before validation (``agent_rl`` under ``agent_grpo`` and ``agent_csd``).

The merge is a deep merge, group first, then the phase section, whose keys win: a sub-section
(``rollout``) merges key by key; any other value, a mapping of free names (``gyms``) included, is
taken whole from the phase section where it is written there. :func:`resolve` also records where
each merged key was written, so that errors name ``agent_rl.lr`` rather than ``agent_csd.lr``.
:mod:`mimesis_lab.config` owns the groups (``SHARED_GROUPS``) and wraps these functions.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from mimesis_lab.config_base import ConfigError, Schema, section_model

__all__ = ["resolve", "override_target", "written_at"]

Origins = dict[tuple[str, ...], tuple[str, ...]]     # resolved key -> the group key it was taken from


def _merge(shared: dict, own: dict, model: type[BaseModel] | None, src: tuple, dst: tuple,
           origins: Origins) -> dict:
    out = {}
    for k, v in shared.items():
        field = model.model_fields.get(k) if model is not None else None
        sub = section_model(field.annotation) if field is not None else None
        if k not in own:
            out[k] = copy.deepcopy(v)
            origins[dst + (k,)] = src + (k,)
        elif sub is not None and isinstance(v, dict) and isinstance(own[k], dict):
            out[k] = _merge(v, own[k], sub, src + (k,), dst + (k,), origins)
        else:
            out[k] = own[k]
    out.update((k, v) for k, v in own.items() if k not in shared)
    return out


def resolve(data: dict[str, Any], schema: Schema, source: str | Path = "<params>") -> tuple[dict[str, Any], Origins]:
    """``data`` with every shared group merged under its member sections and removed, and the
    origins of the merged keys. A member section that is absent (or not a mapping) is left as it is;
    a group that is not a mapping, or that holds a per-phase key (``output_dir``), is a ConfigError."""
    out = {k: v for k, v in data.items() if k not in schema.groups}
    origins: Origins = {}
    for name, group in schema.groups.items():
        if name not in data:
            continue
        shared = data[name]
        if not isinstance(shared, dict):
            raise ConfigError(f"{source}: `{name}`: a shared group must be a mapping, got {type(shared).__name__}")
        for key in schema.per_phase_keys:
            if key in shared:
                raise ConfigError(f"{source}: `{name}.{key}`: write {key} in each phase section "
                                  f"({', '.join(group.members)}), not in the shared group")
        for phase in group.members:
            if isinstance(data.get(phase), dict):
                out[phase] = _merge(shared, data[phase], schema.section(phase), (name,), (phase,), origins)
    return out, origins


def override_target(data: dict[str, Any], key: str, schema: Schema) -> str:
    """Where an override of the dotted ``key`` belongs in ``data`` (as written): in the phase's shared
    group when the phase takes that setting from it, else (the phase writes it itself, or it is not
    shared by every member) as given."""
    phase, *rest = key.split(".")
    group = next((g for g, sg in schema.groups.items() if phase in sg.members), None)
    if group is None or not rest or not isinstance(data.get(group), dict) or rest[0] in schema.per_phase_keys:
        return key
    if not all(rest[0] in schema.section(m).model_fields for m in schema.groups[group].members):
        return key
    node, model = data.get(phase), schema.section(phase)
    for part in rest:
        if not isinstance(node, dict) or part not in node:
            return ".".join([group, *rest])
        field = model.model_fields.get(part) if model is not None else None
        model = section_model(field.annotation) if field is not None else None
        if model is None:            # a value (or a whole mapping of free names) the phase writes itself
            return key
        node = node[part]
    return key


def written_at(loc: tuple[str, ...], origins: Origins) -> tuple[str, ...]:
    """The key as the user wrote it: a resolved key taken from a shared group names the group's key."""
    for n in range(len(loc), 0, -1):
        if loc[:n] in origins:
            return origins[loc[:n]] + loc[n:]
    return loc
