"""Policy-gradient plumbing shared by the RL recipes: the update row, padding, token log-probs,
minibatches, and the policy's weights for a separate rollout engine.

One row type, :class:`UpdateRow`: ``input_ids`` with the trained (policy-generated) tokens at
``positions``, their rollout log-probs ``old_logp`` and one advantage per position. A simulator
segment (a prompt then one contiguous response, one FoldGRPO advantage) is the special case built
by :func:`segment_row`; an agent trajectory has several turns with user/tool tokens in between.
Token ``p`` is predicted by the logits one position earlier, so everything here lives on the
shifted grid ``[B, T-1]``: ``logp[b, t] = log pi(input_ids[b, t+1] | input_ids[b, :t+1])`` and the
response mask is 1 exactly on ``t = p - 1`` for ``p`` in ``positions``.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch

__all__ = ["UpdateRow", "segment_row", "pad_update_rows", "token_logprobs", "cache_layers", "minibatch_indices",
           "minibatch_plan", "micro_chunks", "policy_state_dict"]


@dataclass(frozen=True)
class UpdateRow:
    """A row to train on: the tokens at ``positions`` of ``input_ids`` are the policy's, with their
    rollout log-probs ``old_logp`` and advantages ``adv`` (one per position); every other token is
    context."""

    input_ids: tuple[int, ...]
    positions: tuple[int, ...]
    old_logp: tuple[float, ...]
    adv: tuple[float, ...]
    group_id: str
    rollout_id: str

    @property
    def n_response(self) -> int:
        return len(self.positions)


def segment_row(prompt_ids: Sequence[int], response_ids: Sequence[int], old_logp: Sequence[float], adv: float,
                group_id: str, rollout_id: str) -> UpdateRow:
    """``prompt + response`` with the response trained on, the same advantage on every response token."""
    start, n = len(prompt_ids), len(prompt_ids) + len(response_ids)
    return UpdateRow(tuple(prompt_ids) + tuple(response_ids), tuple(range(start, n)), tuple(old_logp),
                     (float(adv),) * (n - start), group_id, rollout_id)


def pad_update_rows(rows: Sequence[UpdateRow], pad_id: int, device: torch.device | str = "cpu"
                    ) -> dict[str, torch.Tensor]:
    """Right-pad rows into ``input_ids``/``attention_mask`` ``[B, T]`` and shifted
    ``old_logp``/``mask``/``adv`` ``[B, T-1]`` (zero outside the trained positions)."""
    if not rows:
        raise ValueError("no rows to pad")
    width = max(len(r.input_ids) for r in rows)
    b = len(rows)
    ids = torch.full((b, width), int(pad_id), dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    old = torch.zeros((b, width - 1), dtype=torch.float32)
    mask = torch.zeros((b, width - 1), dtype=torch.float32)
    adv = torch.zeros((b, width - 1), dtype=torch.float32)
    for i, r in enumerate(rows):
        n = len(r.input_ids)
        pos, lp, av = list(r.positions), list(r.old_logp), list(r.adv)
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


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Detached per-layer ``(keys, values)`` ``[B, kv_heads, T, d]`` of a forward's KV cache."""
    if hasattr(cache, "layers"):
        return [(layer.keys.detach(), layer.values.detach()) for layer in cache.layers]
    return [(k.detach(), v.detach()) for k, v in cache]   # legacy tuple layout


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   position_ids: torch.Tensor | None = None, cache: Any = None, keep_cache: bool = False):
    """``[B, T-1]`` log-probs of each next token under ``model`` (fp32 log-softmax).

    ``position_ids`` for left-padded rows (positions restart at each row's first real token);
    ``cache`` a KV cache of a prefix the rows continue; ``keep_cache=True`` also returns the
    forward's detached KV cache (:func:`cache_layers`) as ``(logp, layers)``.
    """
    kw: dict[str, Any] = {}
    if position_ids is not None:
        kw["position_ids"] = position_ids
    if cache is not None:
        kw["cache"] = cache
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=keep_cache, **kw)
    logits = out.logits[:, :-1, :].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return (logp, cache_layers(out.past_key_values)) if keep_cache else logp


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


def minibatch_plan(n_rows: int, minibatches: int, rng: random.Random) -> list[list[int]]:
    """Exactly ``minibatches`` parts of ``range(n_rows)`` (:func:`minibatch_indices`, then empty parts): every
    rank runs the same number of optimizer steps per pass, whatever its share of rows."""
    parts = minibatch_indices(n_rows, minibatches, rng) if n_rows else []
    return parts + [[] for _ in range(minibatches - len(parts))]


def micro_chunks(idx: Sequence[int], micro_rows: int) -> list[list[int]]:
    """Split a minibatch into forward/backward chunks of at most ``micro_rows`` rows."""
    if micro_rows < 1:
        raise ValueError(f"micro_rows must be >= 1, got {micro_rows}")
    return [list(idx[i:i + micro_rows]) for i in range(0, len(idx), micro_rows)]


def policy_state_dict(engine) -> dict[str, torch.Tensor]:
    """The policy's full weights for refreshing a separate rollout engine (vLLM) before a step.

    Under ZeRO-3 every rank holds a shard only: the parameters are gathered (all ranks take part)
    and copied out; with ZeRO <= 2 the module's parameters are already whole.
    """
    module = engine.module
    if engine.zero_optimization_stage() >= 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return {k: v.detach().clone() for k, v in module.state_dict().items()}
    return {k: v.detach() for k, v in module.state_dict().items()}
