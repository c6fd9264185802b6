"""Leakage-safe grouped splits.

Rows are linked when they share any key (``user:<id>``, ``conv:<id>``,
``scenario:<key>``); the connected components are the units of assignment, so no
user, conversation or scenario can end up in two splits. Components are shuffled
(seeded) and assigned greedily to the split furthest below its target row count.
"""
from __future__ import annotations

from typing import Hashable, Iterable, Mapping, Sequence

import numpy as np


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Hashable, Hashable] = {}

    def find(self, x: Hashable) -> Hashable:
        parent = self.parent
        parent.setdefault(x, x)
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:  # path compression
            parent[x], x = root, parent[x]
        return root

    def union(self, a: Hashable, b: Hashable) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            if str(ra) < str(rb):
                ra, rb = rb, ra
            self.parent[ra] = rb  # the smaller key names the component: deterministic


def connected_groups(keys_per_row: Sequence[Iterable[str]]) -> list[str]:
    """Component name (its smallest key) for each row; rows sharing a key share a component."""
    uf = _UnionFind()
    rows = [list(k) for k in keys_per_row]
    for keys in rows:
        if not keys:
            raise ValueError("every row needs at least one grouping key")
        for k in keys[1:]:
            uf.union(keys[0], k)
    # roots are the smallest key of each component thanks to the union rule
    return [str(uf.find(keys[0])) for keys in rows]


def assign_splits(group_sizes: Mapping[str, int | Mapping[str, int]], fractions: Mapping[str, float],
                  seed: int) -> dict[str, str]:
    """Map each group to a split name, balancing every stratum (dataset) at once.

    ``group_sizes[g]`` is the group's row count, or its row count per stratum. Groups
    are visited in a seeded random order (of the sorted names, hence reproducible) and
    each goes to the split ``j`` with the largest weighted relative deficit
    ``sum_d n_gd * (f_j * N_d - assigned_jd) / N_d``, so each dataset's realised
    fractions approach the targets; ties go to the split listed first.
    """
    names = list(fractions)
    order = sorted(group_sizes)
    rows = [group_sizes[g] if isinstance(group_sizes[g], Mapping) else {"": group_sizes[g]} for g in order]
    strata = sorted({k for r in rows for k in r})
    m = np.array([[r.get(k, 0) for k in strata] for r in rows], dtype=float).reshape(len(rows), len(strata))
    total = np.maximum(m.sum(axis=0), 1.0)
    target = np.array([fractions[n] for n in names])[:, None] * m.sum(axis=0)[None, :]
    assigned = np.zeros_like(target)
    perm = np.random.default_rng(seed).permutation(len(order))
    out: dict[str, str] = {}
    for i in perm:
        score = ((target - assigned) / total) @ m[i]
        j = int(np.argmax(score))
        out[order[i]] = names[j]
        assigned[j] += m[i]
    return out
