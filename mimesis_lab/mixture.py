"""Seeded source mixture by ``glob: ratio`` (SPEC §2.1).

The mixture is stored as a ``copies`` count per conversation instead of duplicated
rows, so the ``role_swap`` output keeps one row per input conversation (nothing lost,
``rows_in == rows_out + rows_quarantined``) while fully determining the mixed dataset;
:func:`expand_mixture` materialises it (repeat by ``copies``, seeded shuffle).
"""
from __future__ import annotations

import zlib

import numpy as np
import polars as pl


def source_rng(seed: int, source: str) -> np.random.Generator:
    """An RNG per (seed, source): adding a source does not change the others' draws."""
    return np.random.default_rng([seed, zlib.crc32(source.encode("utf-8"))])


def mixture_copies(n: int, ratio: float, rng: np.random.Generator) -> np.ndarray:
    """How many times each of ``n`` items is drawn for a source with ``ratio``.

    ``k = round(ratio * n)`` draws; ``ratio <= 1`` draws without replacement (copies
    are 0/1), ``ratio > 1`` draws with replacement (copies sum to ``k``).
    """
    if ratio <= 0:
        raise ValueError(f"ratio must be > 0, got {ratio}")
    copies = np.zeros(n, dtype=np.int64)
    if n == 0:
        return copies
    k = int(round(ratio * n))
    if ratio <= 1:
        copies[rng.choice(n, size=min(k, n), replace=False)] = 1
    else:
        np.add.at(copies, rng.integers(0, n, size=k), 1)
    return copies


def expand_mixture(df: pl.DataFrame, seed: int, copies: str = "copies") -> pl.DataFrame:
    """Repeat each row ``copies`` times and shuffle (seeded): the mixed training set."""
    if df.is_empty():
        return df
    idx = np.repeat(np.arange(df.height), df.get_column(copies).to_numpy())
    np.random.default_rng(seed).shuffle(idx)
    return df[idx.tolist()] if len(idx) else df.clear()
