"""Sequence packing with exact per-example isolation, and the token-mean loss.

An *example* is ``(input_ids, loss_mask)`` as produced by
:func:`mimesis_lab.chat.tokenize_chat`: ``loss_mask[j] == 1`` marks token ``j`` as a target.

Label layout (pre-shifted)
    ``labels[t]`` is the target scored against ``logits[t]``: ``labels[t] = input_ids[t+1]``
    when token ``t+1`` belongs to the **same example** and ``loss_mask[t+1] == 1``, else
    ``-100``. The last token of every example is ``-100``, so no label ever crosses an example
    boundary, and the first token of an example is never a target (it has no context).
    Never pass these labels to ``model(labels=...)`` (Hugging Face would shift them again):
    use :func:`masked_token_mean_ce` on the logits.

Attention isolation (checked against the installed transformers 5.x, Qwen3, CPU)
    :func:`collate` builds an explicit **4D additive float mask** ``(batch, 1, seq, seq)``:
    0 where query ``i`` may see key ``j`` (same example and ``j <= i``), ``finfo(dtype).min``
    elsewhere. Padding tokens see only themselves (no fully-masked row, so no NaN).
    ``masking_utils._preprocess_mask_arguments`` returns a 4D mask untouched, and both
    ``sdpa`` (``attn_mask=``) and ``eager`` (``attn_weights + mask``) apply it as is; a
    *boolean* 4D mask would be wrong under eager (it would add 1/0), hence float. Works for any
    batch size. ``position_ids`` restart at 0 per example so RoPE sees each example as if alone.

    Alternative ``mask="position_ids"``: no ``attention_mask`` at all; transformers then
    detects packing from the position resets (``find_packed_sequence_indices``, per row, so
    batch > 1 works too) and builds the same block-diagonal causal mask internally. Pads get
    their own position run (0, 1, …) so they form their own segment. It avoids an O(seq²)
    tensor in the batch (long rows); note that flash-attention's own packed detection
    (``modeling_flash_attention_utils._is_packed_sequence``) requires batch size 1, i.e. one
    long row per micro-batch with no padding. Two silent traps
    (both make examples attend to each other with no error): detection only runs when
    ``attention_mask is None`` — any 2D mask, even all ones, disables it
    (huggingface/transformers PR #46634) — and when there is no cache, so the forward call
    **must pass** ``use_cache=False`` (Qwen3 creates a ``DynamicCache`` whenever
    ``config.use_cache`` is on, in train and eval mode alike). The 4D mask has neither trap,
    hence the default.
"""
from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field
from typing import Iterable, Literal, Sequence

import torch

__all__ = [
    "IGNORE_INDEX",
    "PackedRow",
    "tree_example",
    "tree_positions",
    "fit_examples",
    "pack",
    "pad_rows",
    "packing_efficiency",
    "group_by_length",
    "collate",
    "masked_token_ce_sum",
    "masked_token_mean_ce",
]

IGNORE_INDEX = -100
Example = tuple[Sequence[int], Sequence[int]]   # or (input_ids, loss_mask, parents): a prefix-tree example


@dataclass
class PackedRow:
    """One training row (unpadded; :func:`collate` pads it to ``max_len``).

    ``labels`` are pre-shifted (see the module docstring); ``position_ids`` restart at 0 per
    example; ``seq_lens`` are the example lengths in row order; ``example_ids`` index the list
    given to :func:`pack` / :func:`pad_rows`.
    """

    input_ids: list[int]
    labels: list[int]
    position_ids: list[int]
    seq_lens: list[int]
    example_ids: list[int] = field(default_factory=list)
    #: a prefix-tree row: each token's predecessor in its own sequence (-1: an example's first token);
    #: ``None``: every example is one causal run (see :func:`tree_example`)
    parents: list[int] | None = None

    def __len__(self) -> int:
        return len(self.input_ids)


def _check_example(i: int, ids: Sequence[int], mask: Sequence[int], parents: Sequence[int] | None = None) -> None:
    if len(ids) != len(mask):
        raise ValueError(f"example {i}: {len(ids)} input_ids but {len(mask)} loss_mask values")
    if any(m not in (0, 1) for m in mask):
        raise ValueError(f"example {i}: loss_mask must contain only 0/1")
    if parents is not None and (len(parents) != len(ids) or any(not -1 <= q < j for j, q in enumerate(parents))
                                or any(mask[j] and parents[j] != j - 1 for j in range(1, len(ids)))):
        raise ValueError(f"example {i}: parents must name an earlier token (or -1) for each token, and each "
                         "target's parent must be the token before it")


def tree_example(turns: Sequence[tuple[Sequence[int], int]]) -> tuple[list[int], list[int], list[int]]:
    """Several sequences that share prefixes as one prefix-tree example ``(input_ids, loss_mask, parents)``.

    ``turns`` are ``(ids, start)``: a sequence whose tokens from ``start`` on are targets (one turn given its
    own context). Each turn follows the tree as far as an earlier turn laid the same tokens down and adds the
    rest as a new branch (:func:`mimesis_lab.rl.policy.trajectory_row`, which this calls): the same targets,
    each under exactly its own turn's context, with the shared context encoded once. Example: the public
    history ``sys u1 x1 a1`` is shared by turn 2 (``sys u1 x1 a1 <think>z2</think>x2``) and turn 1's branch
    ``sys u1 <think>z1</think>x1``."""
    from mimesis_lab.rl.policy import UpdateRow, trajectory_row

    rows = []
    for k, (ids, start) in enumerate(turns):
        if not 1 <= start < len(ids):
            raise ValueError(f"turn {k}: target start {start} must lie in 1..{len(ids) - 1}")
        n = len(ids) - start
        rows.append(UpdateRow(tuple(ids), tuple(range(start, len(ids))), (0.0,) * n, (0.0,) * n, "", str(k)))
    tree = trajectory_row(rows)
    mask = [0] * len(tree.input_ids)
    for p in tree.positions:
        mask[p] = 1
    return list(tree.input_ids), mask, list(tree.parents)


def fit_examples(
    examples: Iterable[Example], max_len: int, overlong: Literal["truncate", "drop"] = "truncate"
) -> tuple[list[tuple[list[int], list[int]]], dict[str, int]]:
    """Make every example fit ``max_len`` tokens.

    ``overlong="truncate"`` keeps the first ``max_len`` tokens (right truncation), ``"drop"``
    discards the example. Afterwards an example with no target (``sum(loss_mask[1:]) == 0``:
    the first token can never be a target, see the label layout) is dropped as well.

    Returns ``(kept, stats)`` with ``stats`` = ``examples_in``, ``examples_out``, ``truncated``,
    ``dropped_overlong``, ``dropped_no_target``, ``tokens_in``, ``tokens_out``,
    ``target_tokens_out`` (``examples_in == examples_out + dropped_overlong + dropped_no_target``).
    """
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2, got {max_len}")
    if overlong not in ("truncate", "drop"):
        raise ValueError(f"overlong must be 'truncate' or 'drop', got {overlong!r}")
    stats = dict.fromkeys(
        ("examples_in", "examples_out", "truncated", "dropped_overlong", "dropped_no_target",
         "tokens_in", "tokens_out", "target_tokens_out"), 0)
    kept: list[tuple[list[int], ...]] = []
    for i, ex in enumerate(examples):
        ids, mask = ex[0], ex[1]
        parents = list(ex[2]) if len(ex) > 2 and ex[2] is not None else None
        _check_example(i, ids, mask, parents)
        stats["examples_in"] += 1
        stats["tokens_in"] += len(ids)
        ids, mask = list(ids), list(mask)
        if len(ids) > max_len:
            if overlong == "drop":
                stats["dropped_overlong"] += 1
                continue
            # a tree keeps its first max_len tokens too: every parent precedes its child
            ids, mask = ids[:max_len], mask[:max_len]
            parents = parents[:max_len] if parents is not None else None
            stats["truncated"] += 1
        n_target = sum(mask[1:])
        if n_target == 0:
            stats["dropped_no_target"] += 1
            continue
        kept.append((ids, mask) if parents is None else (ids, mask, parents))
        stats["examples_out"] += 1
        stats["tokens_out"] += len(ids)
        stats["target_tokens_out"] += n_target
    return kept, stats


def _shifted_labels(ids: Sequence[int], mask: Sequence[int]) -> list[int]:
    """``labels[t] = ids[t+1]`` where ``mask[t+1] == 1``; the last position is always ignored."""
    out = [ids[t + 1] if mask[t + 1] else IGNORE_INDEX for t in range(len(ids) - 1)]
    out.append(IGNORE_INDEX)
    return out


def _parents_of(ex: Example) -> Sequence[int] | None:
    return ex[2] if len(ex) > 2 else None   # type: ignore[misc]


def tree_positions(parents: Sequence[int]) -> list[int]:
    """Each token's position in its own sequence (its depth in the prefix tree: roots at 0)."""
    pos: list[int] = []
    for j, q in enumerate(parents):
        pos.append(0 if q < 0 else pos[q] + 1)
    return pos


def _make_row(examples: Sequence[Example], members: Sequence[int]) -> PackedRow:
    tree = any(_parents_of(examples[k]) is not None for k in members)
    row = PackedRow([], [], [], [], [], [] if tree else None)
    for k in members:
        ids, mask = examples[k][0], examples[k][1]
        start = len(row.input_ids)
        row.input_ids.extend(ids)
        row.labels.extend(_shifted_labels(ids, mask))   # a target's parent is the token before it
        parents = _parents_of(examples[k])
        if row.parents is not None:
            own = list(parents) if parents is not None else list(range(-1, len(ids) - 1))
            row.parents.extend(q + start if q >= 0 else -1 for q in own)
            row.position_ids.extend(tree_positions(own))
        else:
            row.position_ids.extend(range(len(ids)))
        row.seq_lens.append(len(ids))
        row.example_ids.append(k)
    return row


def _validate_for_rows(examples: Sequence[Example], max_len: int) -> None:
    for i, ex in enumerate(examples):
        ids, mask = ex[0], ex[1]
        _check_example(i, ids, mask, _parents_of(ex))
        if not 0 < len(ids) <= max_len:
            raise ValueError(f"example {i} has {len(ids)} tokens; need 1..{max_len} (run fit_examples first)")


def pack(examples: Sequence[Example], max_len: int, seed: int | None = None) -> list[PackedRow]:
    """Pack examples into rows of at most ``max_len`` tokens (best-fit decreasing).

    Examples are taken longest first (ties: lower index first); each goes into the open row with
    the least room that still fits it (ties: the oldest row), else a new row. Inside a row the
    examples keep their input order. Fully deterministic; ``seed`` (optional) only shuffles the
    order of the returned rows. Every example must already fit (see :func:`fit_examples`).
    """
    _validate_for_rows(examples, max_len)
    order = sorted(range(len(examples)), key=lambda k: (-len(examples[k][0]), k))
    members: list[list[int]] = []
    free: list[tuple[int, int]] = []  # sorted (room left, row index)
    for k in order:
        n = len(examples[k][0])
        pos = bisect.bisect_left(free, (n, -1))
        if pos < len(free):
            room, r = free.pop(pos)
        else:
            room, r = max_len, len(members)
            members.append([])
        members[r].append(k)
        if room - n > 0:
            bisect.insort(free, (room - n, r))
    rows = [_make_row(examples, sorted(m)) for m in members]
    if seed is not None:
        random.Random(seed).shuffle(rows)
    return rows


def pad_rows(examples: Sequence[Example], max_len: int) -> list[PackedRow]:
    """The unpacked baseline: one example per row, in input order (right-padded by :func:`collate`)."""
    _validate_for_rows(examples, max_len)
    return [_make_row(examples, [k]) for k in range(len(examples))]


def packing_efficiency(rows: Sequence[PackedRow], max_len: int) -> float:
    """Real tokens / (rows × max_len); 0.0 for no rows."""
    if not rows:
        return 0.0
    return sum(len(r) for r in rows) / (len(rows) * max_len)


def group_by_length(lengths: Sequence[int], budget: int, seed: int, mega: int = 50) -> list[list[int]]:
    """Length-grouped micro-batches (dynamic padding): lists of indices into ``lengths`` such that
    ``len(group) * max(lengths of the group) <= budget`` (the padded tokens of a micro-batch).

    The order of Hugging Face's ``LengthGroupedSampler`` (TRL/HF ``group_by_length``): a seeded
    shuffle, then mega-batches of about ``mega`` micro-batches (``mega * max(1, budget // mean
    length)`` examples), each sorted by length (longest first, ties by index) and cut greedily into
    micro-batches that stay within ``budget``. Every index appears in exactly one group; a group
    never mixes two mega-batches. Deterministic given ``seed``. Each length must be 1..``budget``.
    """
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    bad = [i for i, n in enumerate(lengths) if not 0 < n <= budget]
    if bad:
        raise ValueError(f"example {bad[0]} has {lengths[bad[0]]} tokens; need 1..{budget}")
    if not lengths:
        return []
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    per_group = max(1, budget * len(lengths) // max(1, sum(lengths)))
    size = max(1, mega * per_group)
    groups: list[list[int]] = []
    for start in range(0, len(order), size):
        chunk = sorted(order[start:start + size], key=lambda k: (-lengths[k], k))
        group: list[int] = []
        for k in chunk:        # longest first: the group's width is its first member's length
            if group and (len(group) + 1) * lengths[group[0]] > budget:
                groups.append(group)
                group = []
            group.append(k)
        groups.append(group)
    return groups


def collate(
    rows: Sequence[PackedRow],
    max_len: int,
    pad_id: int,
    mask: Literal["4d", "position_ids", "padding"] = "4d",
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Stack rows into right-padded ``(batch, max_len)`` tensors.

    Returns ``input_ids``, ``labels`` (pre-shifted, pads ``-100``), ``position_ids`` (restart at 0
    per example; pads get their own 0, 1, … run) and, for ``mask="4d"``, ``attention_mask``: a
    ``(batch, 1, max_len, max_len)`` additive mask in ``dtype`` (use the model's dtype) that is
    block-diagonal causal over examples, with each pad attending only to itself. With
    ``mask="position_ids"`` no ``attention_mask`` is returned and the forward call must pass
    ``use_cache=False`` (see the module docstring). ``mask="padding"`` is for rows of one example
    each (dynamic padding): a 2D ``attention_mask`` (1 real, 0 pad; the model adds causality) and
    position ids ``0..max_len-1`` per row; right padding, so no query row is fully masked.
    Feed as ``model(input_ids=…, attention_mask=…, position_ids=…)``; never pass ``labels``.
    """
    if not rows:
        raise ValueError("collate needs at least one row")
    if mask not in ("4d", "position_ids", "padding"):
        raise ValueError(f"mask must be '4d', 'position_ids' or 'padding', got {mask!r}")
    trees = any(r.parents is not None for r in rows)
    if trees and mask == "position_ids":
        raise ValueError("prefix-tree rows need an attention mask: use mask='4d' or 'padding' (a 4D tree mask "
                         "is then built either way)")
    if mask == "padding" and any(len(r.seq_lens) != 1 for r in rows):
        raise ValueError("mask='padding' needs rows of one example each (packed rows need '4d' or 'position_ids')")
    b = len(rows)
    input_ids = torch.full((b, max_len), pad_id, dtype=torch.long)
    labels = torch.full((b, max_len), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((b, max_len), dtype=torch.long)
    segment = torch.empty((b, max_len), dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row)
        if n > max_len:
            raise ValueError(f"row {i} has {n} tokens > max_len {max_len}")
        if sum(row.seq_lens) != n or len(row.labels) != n or len(row.position_ids) != n:
            raise ValueError(f"row {i} is inconsistent (seq_lens/labels/position_ids vs input_ids)")
        input_ids[i, :n] = torch.tensor(row.input_ids, dtype=torch.long)
        labels[i, :n] = torch.tensor(row.labels, dtype=torch.long)
        position_ids[i, :n] = torch.tensor(row.position_ids, dtype=torch.long)
        position_ids[i, n:] = torch.arange(max_len - n)
        seg = torch.repeat_interleave(torch.arange(len(row.seq_lens)), torch.tensor(row.seq_lens, dtype=torch.long))
        segment[i, :n] = seg
        # every pad is its own segment: with causality it sees only itself
        segment[i, n:] = len(row.seq_lens) + torch.arange(max_len - n)
    out = {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}
    if trees and any(r.parents is None and len(r.seq_lens) != 1 for r in rows):
        raise ValueError("a packed plain row cannot share a micro-batch with prefix-tree rows")
    if trees:   # a token sees its ancestors and itself; pads only themselves (mimesis_lab.rl.policy)
        from mimesis_lab.rl.policy import tree_attention

        _, allowed = tree_attention(rows, max_len)
        additive = torch.zeros((b, 1, max_len, max_len), dtype=dtype)
        additive.masked_fill_(~allowed, torch.finfo(dtype).min)
        out["attention_mask"] = additive
        return out
    if mask == "padding":
        out["attention_mask"] = (segment == 0).long()      # one example per row: segment 0 is the example
        out["position_ids"] = torch.arange(max_len).expand(b, -1).clone()
    if mask == "4d":
        causal = torch.ones((max_len, max_len), dtype=torch.bool).tril()
        allowed = (segment[:, :, None] == segment[:, None, :]) & causal
        additive = torch.zeros((b, 1, max_len, max_len), dtype=dtype)
        additive.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
        out["attention_mask"] = additive
    return out


def masked_token_ce_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum of CE over tokens with label != -100, their count)``; ``logits[..., t, :]`` is scored
    against ``labels[..., t]`` (labels pre-shifted, no further shift). Computed in fp32.

    For a global token mean across ranks/micro-batches: all-reduce both, then divide.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")
    flat_logits = logits.reshape(-1, logits.shape[-1]).float()
    flat_labels = labels.reshape(-1)
    total = torch.nn.functional.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="sum")
    count = (flat_labels != IGNORE_INDEX).sum()
    return total, count


def masked_token_mean_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Token-mean cross-entropy over labels != -100 (pre-shifted labels: ``logits[t]`` vs ``labels[t]``).

    With no target token it returns a graph-connected 0 (``0 * logits.sum()``), so backward works.
    """
    total, count = masked_token_ce_sum(logits, labels)
    if int(count) == 0:
        return logits.sum() * 0.0
    return total / count
