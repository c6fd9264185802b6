"""Policy-gradient plumbing shared by the RL recipes: the update row, padding, token log-probs,
minibatches, and the policy's weights for a separate rollout engine.

One row type, :class:`UpdateRow`: ``input_ids`` with the trained (policy-generated) tokens at
``positions``, their rollout log-probs ``old_logp`` and one advantage per position. A simulator
segment (a prompt then one contiguous response, one FoldGRPO advantage) is the special case built
by :func:`segment_row`; an agent trajectory has several turns with user/tool tokens in between.
Token ``p`` is predicted by the logits one position earlier, so everything here lives on the
shifted grid ``[B, T-1]``: ``logp[b, t] = log pi(input_ids[b, t+1] | input_ids[b, :t+1])`` and the
response mask is 1 exactly on ``t = p - 1`` for ``p`` in ``positions``.

A simulator rollout's later prompts are not its earlier prompt + response (the history keeps the
public utterance, not the ``<think>`` block), so its segments cannot be one flat row. Instead
:func:`trajectory_row` lays them out as a *prefix tree*: tokens shared by several segments' inputs
once, each segment's divergent suffix (prompt tail + response) as a branch. Each token's
``parents`` entry names its predecessor in its own segment; :func:`pad_update_rows` turns that
into a 4D attention mask (a token sees its ancestors only) and position ids (its position in its
own segment), so every trained token's log-prob is the one of its :func:`segment_row`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from mimesis_lab.models import supports_logits_to_keep

__all__ = ["UpdateRow", "segment_row", "trajectory_row", "tree_attention", "pad_update_rows", "token_logprobs", "cache_layers",
           "minibatch_indices", "minibatch_plan", "micro_chunks", "policy_state_dict"]


@dataclass(frozen=True)
class UpdateRow:
    """A row to train on: the tokens at ``positions`` of ``input_ids`` are the policy's, with their
    rollout log-probs ``old_logp`` and advantages ``adv`` (one per position); every other token is
    context. ``parents`` (a prefix-tree row, :func:`trajectory_row`): the index of each token's
    predecessor in its own sequence, ``-1`` at the root; ``None``: a plain causal row."""

    input_ids: tuple[int, ...]
    positions: tuple[int, ...]
    old_logp: tuple[float, ...]
    adv: tuple[float, ...]
    group_id: str
    rollout_id: str
    parents: tuple[int, ...] | None = None

    @property
    def n_response(self) -> int:
        return len(self.positions)


def segment_row(prompt_ids: Sequence[int], response_ids: Sequence[int], old_logp: Sequence[float], adv: float,
                group_id: str, rollout_id: str) -> UpdateRow:
    """``prompt + response`` with the response trained on, the same advantage on every response token."""
    start, n = len(prompt_ids), len(prompt_ids) + len(response_ids)
    return UpdateRow(tuple(prompt_ids) + tuple(response_ids), tuple(range(start, n)), tuple(old_logp),
                     (float(adv),) * (n - start), group_id, rollout_id)


def trajectory_row(turns: Sequence[UpdateRow]) -> UpdateRow:
    """One rollout's plain turn rows (:func:`segment_row`, FoldGRPO advantage per segment) as one
    prefix-tree row with the same trained tokens, log-probs and advantages, in the same order.

    Each turn's context (the tokens before its first trained one) follows the tree as far as an
    earlier turn laid the same tokens down (the longest common prefix with any earlier turn's input);
    the rest of the turn becomes a new branch. The token just before the first trained one is always
    the row's previous token (laid again if need be), so the shifted grid of :func:`pad_update_rows`
    holds: a trained token at ``p`` is predicted by the logits at ``p - 1``, under exactly the
    history of its own turn.
    """
    if not turns:
        raise ValueError("no turns to lay out")
    ids: list[int] = []
    parents: list[int] = []
    positions: list[int] = []
    old: list[float] = []
    adv: list[float] = []
    edges: dict[tuple[int, int], int] = {}        # (parent index, token) -> index of that child
    for t in turns:
        if t.parents is not None or not t.positions or min(t.positions) < 1:
            raise ValueError(f"rollout {t.rollout_id}: a turn must be a plain row with a trained token after "
                             "some context")
        first = min(t.positions)
        node, k = -1, 0
        while k < first and (node, t.input_ids[k]) in edges:
            node, k = edges[(node, t.input_ids[k])], k + 1
        if k == first and node != len(ids) - 1:
            node, k = parents[node], k - 1
        base = len(ids) - k
        for tok in t.input_ids[k:]:
            ids.append(tok)
            parents.append(node)
            edges.setdefault((node, tok), len(ids) - 1)
            node = len(ids) - 1
        positions += [p + base for p in t.positions]
        old += t.old_logp
        adv += t.adv
    return UpdateRow(tuple(ids), tuple(positions), tuple(old), tuple(adv), turns[0].group_id, turns[0].rollout_id,
                     tuple(parents))


def _branches(parents: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(start, end, parent)`` runs of a prefix-tree row: inside a run each token follows the one
    before it; ``parent`` is the predecessor of the run's first token (``-1``: the root)."""
    starts = [0] + [j for j in range(1, len(parents)) if parents[j] != j - 1]
    ends = starts[1:] + [len(parents)]
    return [(a, b, parents[a]) for a, b in zip(starts, ends)]


def tree_attention(rows: Sequence[UpdateRow], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``position_ids`` ``[B, T]`` (a token's position in its own sequence) and the boolean 4D
    ``attention_mask`` ``[B, 1, T, T]`` (``True``: the key is the query's ancestor or itself) of
    prefix-tree rows; a plain row is one causal run, and every pad sees only itself."""
    b = len(rows)
    pos = torch.zeros((b, width), dtype=torch.long)
    seen = torch.eye(width, dtype=torch.bool).repeat(b, 1, 1)
    for i, r in enumerate(rows):
        n = len(r.input_ids)
        seen[i, :n, :n] = False
        for a, e, parent in _branches(r.parents if r.parents is not None else range(-1, n - 1)):
            if parent >= 0:
                seen[i, a:e, :a] = seen[i, parent, :a]
                pos[i, a:e] = pos[i, parent] + 1
            seen[i, a:e, a:e] = torch.ones((e - a, e - a), dtype=torch.bool).tril()
            pos[i, a:e] += torch.arange(e - a)
    return pos, seen[:, None]


def _check_row(i: int, r: UpdateRow) -> None:
    n = len(r.input_ids)
    pos = r.positions
    if not (len(pos) == len(r.old_logp) == len(r.adv)) or any(p < 1 or p >= n for p in pos):
        raise ValueError(f"row {i} (rollout {r.rollout_id}): {len(pos)} positions, {len(r.old_logp)} log-probs, "
                         f"{len(r.adv)} advantages, positions must lie in 1..{n - 1}")
    if r.parents is not None and (len(r.parents) != n or any(not -1 <= q < j for j, q in enumerate(r.parents))
                                  or any(r.parents[p] != p - 1 for p in pos)):
        raise ValueError(f"row {i} (rollout {r.rollout_id}): parents must name an earlier token (or -1) for each "
                         "of the row's tokens, and each trained token's parent must be the token before it")


def pad_update_rows(rows: Sequence[UpdateRow], pad_id: int, device: torch.device | str = "cpu"
                    ) -> dict[str, torch.Tensor]:
    """Right-pad rows into ``input_ids``/``attention_mask`` ``[B, T]`` and shifted
    ``old_logp``/``mask``/``adv`` ``[B, T-1]`` (zero outside the trained positions).

    With a prefix-tree row in the batch (:func:`trajectory_row`) there are also ``position_ids``
    ``[B, T]`` and ``attention_mask`` is the boolean 4D mask ``[B, 1, T, T]`` of :func:`tree_attention`
    (:func:`token_logprobs` hands it to the model in the form attention applies).
    """
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
        _check_row(i, r)
        n = len(r.input_ids)
        ids[i, :n] = torch.tensor(r.input_ids, dtype=torch.long)
        attn[i, :n] = 1
        if r.positions:
            shifted = torch.tensor(r.positions, dtype=torch.long) - 1
            old[i, shifted] = torch.tensor(r.old_logp, dtype=torch.float32)
            mask[i, shifted] = 1.0
            adv[i, shifted] = torch.tensor(r.adv, dtype=torch.float32)
    out = {"input_ids": ids, "attention_mask": attn, "old_logp": old, "mask": mask, "adv": adv}
    if any(r.parents is not None for r in rows):
        out["position_ids"], out["attention_mask"] = tree_attention(rows, width)
    return {k: v.to(device) for k, v in out.items()}


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Detached per-layer ``(keys, values)`` ``[B, kv_heads, T, d]`` of a forward's KV cache."""
    if hasattr(cache, "layers"):
        return [(layer.keys.detach(), layer.values.detach()) for layer in cache.layers]
    return [(k.detach(), v.detach()) for k, v in cache]   # legacy tuple layout


def _additive_mask(model, allowed: torch.Tensor) -> torch.Tensor:
    """A boolean 4D mask (``True``: may attend) as the additive float mask, in the model's dtype, that
    both ``sdpa`` and ``eager`` attention apply as given (0 where allowed, ``finfo.min`` elsewhere;
    :mod:`mimesis_lab.packing` does the same). Other implementations (flash attention) would not
    apply it, so they are refused."""
    impl = getattr(getattr(model, "module", model).config, "_attn_implementation", None)
    if impl not in ("sdpa", "eager"):
        raise ValueError(f"a 4D attention mask (prefix-tree rows) needs sdpa or eager attention; the model uses "
                         f"{impl!r}")
    dtype = next(model.parameters()).dtype
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, torch.finfo(dtype).min)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   position_ids: torch.Tensor | None = None, cache: Any = None, keep_cache: bool = False,
                   need: torch.Tensor | None = None):
    """``[B, T-1]`` log-probs of each next token under ``model`` (fp32 log-softmax).

    ``position_ids`` for left-padded rows (positions restart at each row's first real token) and
    prefix-tree rows; ``attention_mask`` 2D (padding) or a boolean 4D mask (:func:`pad_update_rows`);
    ``cache`` a KV cache of a prefix the rows continue; ``keep_cache=True`` also returns the
    forward's detached KV cache (:func:`cache_layers`) as ``(logp, layers)``.
    ``need`` (``[B, T-1]``, nonzero where a log-prob is used, e.g. the loss mask): the LM head and the
    log-softmax run on those positions only, where the model takes ``logits_to_keep``
    (:func:`mimesis_lab.models.supports_logits_to_keep`); the other entries are 0. The same values
    where needed: the vocabulary projection dominates a small model's forward over a long prompt.
    """
    if attention_mask.dim() == 4:
        attention_mask = _additive_mask(model, attention_mask)
    kw: dict[str, Any] = {}
    if position_ids is not None:
        kw["position_ids"] = position_ids
    if cache is not None:
        kw["cache"] = cache
    if need is not None and supports_logits_to_keep(model):
        need = need != 0
        keep = torch.nn.functional.pad(need, (0, 1))      # logits at t score token t + 1
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=keep_cache, logits_to_keep=keep,
                    **kw)
        picked = torch.log_softmax(out.logits.float(), dim=-1).gather(
            -1, input_ids[:, 1:][need].unsqueeze(-1)).squeeze(-1)
        logp = torch.zeros(need.shape, dtype=picked.dtype, device=picked.device).masked_scatter(need, picked)
    else:
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
