"""Chat data transforms: the role swap for user-side mid-training (SPEC §2.1).

Pure functions on lists of ``{"role", "content"}`` messages, plus the vectorised
polars form used by the ``role_swap`` stage. Both give identical results (tested).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import polars as pl

ROLES = ("system", "user", "assistant")
_SWAP = {"user": "assistant", "assistant": "user"}


def role_swap(messages: Sequence[Mapping[str, Any]], swap: bool = True) -> list[dict[str, Any]]:
    """Swap the user and assistant roles, keeping system messages (SPEC §2.1).

    The human's turns move to the generated ``assistant`` slot (loss mask 1 later),
    the AI's answers move to the ``user`` context slot. ``swap=False`` is the
    no-swap processor: a copy with the roles unchanged. Every other key of a message
    is copied as is. An unknown role raises ``ValueError`` naming its index.
    """
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        role = msg.get("role")
        if role not in ROLES:
            raise ValueError(f"message {i}: unknown role {role!r} (expected one of {ROLES})")
        new = dict(msg)
        if swap and role in _SWAP:
            new["role"] = _SWAP[role]
        out.append(new)
    return out


def swap_roles_expr(messages: str = "messages") -> pl.Expr:
    """Polars expression applying :func:`role_swap` (``swap=True``) to a list[struct{role,…}] column."""
    return pl.col(messages).list.eval(
        pl.element().struct.with_fields(pl.field("role").replace(_SWAP))
    )


def role_swap_frame(df: pl.DataFrame, messages: str = "messages", swap: str = "swap") -> pl.DataFrame:
    """Vectorised role swap: rows with ``swap`` true are swapped, the others copied unchanged."""
    return df.with_columns(
        pl.when(pl.col(swap)).then(swap_roles_expr(messages)).otherwise(pl.col(messages)).alias(messages)
    )
