"""Policy-gradient plumbing shared by the RL jobs: padding segments, token log-probs, minibatches.

A row is ``input_ids = prompt + response`` with the response starting at ``start``; its
response tokens are predicted by the logits one position earlier, so everything here lives on
the shifted grid ``[B, T-1]``: ``logp[b, t] = log pi(input_ids[b, t+1] | input_ids[b, :t+1])``
and the response mask is 1 exactly on ``t in [start-1, len-1)``.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from mimesis_lab.rl.sim_batch import UpdateRow

__all__ = ["TokenRow", "pad_update_rows", "token_logprobs", "minibatch_indices", "micro_chunks"]


@dataclass(frozen=True)
class TokenRow:
    """A multi-turn row: ``input_ids`` with the trained (agent-generated) tokens at ``positions``
    (response mask 1 exactly there; user/tool tokens in between are context), their rollout
    log-probs ``old_logp`` and per-token advantages ``adv`` (one per position)."""

    input_ids: tuple[int, ...]
    positions: tuple[int, ...]
    old_logp: tuple[float, ...]
    adv: tuple[float, ...]
    group_id: str
    rollout_id: str

    @property
    def n_response(self) -> int:
        return len(self.positions)


def _pad_token_rows(rows: Sequence[Any], pad_id: int, device) -> dict[str, torch.Tensor]:
    width = max(len(r.input_ids) for r in rows)
    b = len(rows)
    ids = torch.full((b, width), int(pad_id), dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    old = torch.zeros((b, width - 1), dtype=torch.float32)
    mask = torch.zeros((b, width - 1), dtype=torch.float32)
    adv = torch.zeros((b, width - 1), dtype=torch.float32)
    for i, r in enumerate(rows):
        n = len(r.input_ids)
        if isinstance(r, TokenRow):
            pos, lp, av = list(r.positions), list(r.old_logp), list(r.adv)
        else:   # one advantage on the contiguous response of an UpdateRow
            pos, lp, av = list(range(r.start, n)), list(r.old_logp), [float(r.adv)] * (n - r.start)
        if not (len(pos) == len(lp) == len(av)) or any(p < 1 or p >= n for p in pos):
            raise ValueError(f"row {i} (rollout {r.rollout_id}): {len(pos)} positions, {len(lp)} log-probs, "
                             f"{len(av)} advantages, positions must lie in 1..{n - 1}")
        ids[i, :n] = torch.tensor(r.input_ids, dtype=torch.long)
        attn[i, :n] = 1
        if pos:
            shifted = torch.tensor(pos, dtype=torch.long) - 1
            old[i, shifted] = torch.tensor(lp, dtype=torch.float32)
            mask[i, shifted] = 1.0
            adv[i, shifted] = torch.tensor(av, dtype=torch.float32)
    out = {"input_ids": ids, "attention_mask": attn, "old_logp": old, "mask": mask, "adv": adv}
    return {k: v.to(device) for k, v in out.items()}


def pad_update_rows(rows: Sequence[Any], pad_id: int, device: torch.device | str = "cpu"
                    ) -> dict[str, torch.Tensor]:
    """Right-pad rows into ``input_ids``/``attention_mask`` ``[B, T]`` and shifted
    ``old_logp``/``mask`` ``[B, T-1]`` plus ``adv`` (``[B, 1]`` for one advantage per row, or
    ``[B, T-1]`` when any row is a :class:`TokenRow` with per-token advantages)."""
    if not rows:
        raise ValueError("no rows to pad")
    if any(isinstance(r, TokenRow) for r in rows):
        return _pad_token_rows(rows, pad_id, device)
    width = max(len(r.input_ids) for r in rows)
    b = len(rows)
    ids = torch.full((b, width), int(pad_id), dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    old = torch.zeros((b, width - 1), dtype=torch.float32)
    mask = torch.zeros((b, width - 1), dtype=torch.float32)
    adv = torch.zeros((b, 1), dtype=torch.float32)
    for i, r in enumerate(rows):
        n = len(r.input_ids)
        if r.start < 1 or r.start >= n:
            raise ValueError(f"row {i} (rollout {r.rollout_id}): response start {r.start} outside 1..{n - 1}")
        if len(r.old_logp) != n - r.start:
            raise ValueError(f"row {i} (rollout {r.rollout_id}): {n - r.start} response tokens but "
                             f"{len(r.old_logp)} old log-probs")
        ids[i, :n] = torch.tensor(r.input_ids, dtype=torch.long)
        attn[i, :n] = 1
        old[i, r.start - 1:n - 1] = torch.tensor(r.old_logp, dtype=torch.float32)
        mask[i, r.start - 1:n - 1] = 1.0
        adv[i, 0] = float(r.adv)
    out = {"input_ids": ids, "attention_mask": attn, "old_logp": old, "mask": mask, "adv": adv}
    return {k: v.to(device) for k, v in out.items()}


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T-1]`` log-probs of each next token under ``model`` (fp32 log-softmax)."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    logits = out.logits[:, :-1, :].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def minibatch_indices(n: int, minibatches: int, rng: random.Random) -> list[list[int]]:
    """Shuffle ``range(n)`` and cut it into ``min(minibatches, n)`` near-equal parts (none empty)."""
    order = list(range(n))
    rng.shuffle(order)
    k = max(1, min(minibatches, n))
    size, extra = divmod(n, k)
    out, pos = [], 0
    for j in range(k):
        step = size + (1 if j < extra else 0)
        out.append(order[pos:pos + step])
        pos += step
    return [m for m in out if m]


def micro_chunks(idx: Sequence[int], micro_rows: int) -> list[list[int]]:
    """Split a minibatch into forward/backward chunks of at most ``micro_rows`` rows."""
    if micro_rows < 1:
        raise ValueError(f"micro_rows must be >= 1, got {micro_rows}")
    return [list(idx[i:i + micro_rows]) for i in range(0, len(idx), micro_rows)]
