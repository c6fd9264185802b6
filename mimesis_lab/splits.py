"""Leakage-safe grouped splits.

Rows are linked when they share any key (``user:<id>``, ``conv:<id>``,
``scenario:<key>``); the connected components are the units of assignment, so no
user, conversation or scenario can end up in two splits. Components are shuffled
(seeded) and assigned greedily to the split furthest below its target row count.
"""
from __future__ import annotations

from typing import Hashable, Iterable, Sequence

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


def assign_splits(group_sizes: dict[str, int], fractions: dict[str, float], seed: int) -> dict[str, str]:
    """Map each group to a split name.

    Groups are visited in a seeded random order (from a sorted, hence reproducible,
    list) and each goes to the split with the largest deficit ``target - assigned``,
    where ``target = fraction * total rows``; ties go to the split listed first.
    """
    names = list(fractions)
    total = sum(group_sizes.values())
    target = np.array([fractions[n] * total for n in names])
    assigned = np.zeros(len(names))
    order = sorted(group_sizes)
    perm = np.random.default_rng(seed).permutation(len(order))
    out: dict[str, str] = {}
    for i in perm:
        g = order[i]
        j = int(np.argmax(target - assigned))
        out[g] = names[j]
        assigned[j] += group_sizes[g]
    return out
