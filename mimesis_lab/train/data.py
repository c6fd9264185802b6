"""Training data for the DeepSpeed loop: split parquet → token rows → a deterministic plan.

1. :func:`read_conversations` reads a split parquet (column ``messages``: list of
   ``{role, content}``). For the training split, a mixture ``copies`` column (written by the
   ``role_swap`` stage) is expanded with :func:`mimesis_lab.mixture.expand_mixture` (repeat by
   ``copies``, seeded shuffle); validation splits are read one row per conversation. A
   missing file, a missing ``messages`` column or an empty split (also: empty after the
   expansion) raises :class:`DataError` naming the file.
2. :func:`build_rows` tokenises with :func:`mimesis_lab.chat.tokenize_many` (loss mask on the
   ``train_role`` content), makes every example fit ``max_len`` with
   :func:`mimesis_lab.packing.fit_examples` (``truncate`` | ``drop``, counted), then, by the
   ``batching`` mode (:data:`BATCHING`), packs (``packed``: :func:`mimesis_lab.packing.pack`,
   block-diagonal attention) or keeps one example per row (``grouped``, ``padded``).
3. :func:`batch_units` turns the rows into *units*, what the plan shuffles: one row per unit for
   ``packed``/``padded`` (a micro-step takes ``micro_batch`` units, each row padded to ``max_len``),
   or, for ``grouped`` (length-grouped dynamic padding), one micro-batch per unit: examples of
   similar length (:func:`mimesis_lab.packing.group_by_length`) whose padded size, count x the
   longest, is at most ``micro_batch * max_len`` tokens, as many as ``micro_batch`` packed rows
   hold, so the global batch in tokens (and the lr settings) carry over. The groups are made once
   per run; each epoch visits them in a new order.
4. :class:`DataPlan` decides which units every rank sees at every step, as a pure function of
   ``(seed, step)``: the units form an endless stream, epoch ``e`` being the permutation
   ``default_rng([seed, e]).permutation(n_rows)``; optimizer step ``s`` consumes stream
   positions ``[s*G, (s+1)*G)`` with ``G = micro_batch * grad_accum * world_size`` (the global
   batch, in units). Micro-step ``k`` of rank ``r`` takes the ``micro_batch`` units starting at
   ``k*world_size*micro_batch + r*micro_batch`` of that window. The *set* of units in a step
   depends only on ``(seed, step, G)``, not on the world size, and the data cursor of a
   checkpoint is just the step: resuming needs no data-loader state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import polars as pl

from mimesis_lab.chat import tokenize_many
from mimesis_lab.io import ParquetReadError, read_parquet
from mimesis_lab.mixture import expand_mixture
from mimesis_lab.packing import (IGNORE_INDEX, PackedRow, fit_examples, group_by_length, pack, packing_efficiency,
                                 pad_rows)

__all__ = ["BATCHING", "HISTORY", "DataError", "read_conversations", "build_rows", "public_history_examples",
           "load_rows", "resolve_batching",
           "batch_units", "batch_efficiency", "DataPlan", "target_count", "eval_batches"]

#: The batching modes of the SFT-style phases (``auto`` resolves to one of them per device).
BATCHING = ("packed", "grouped", "padded")
HISTORY = ("full", "public")


class DataError(ValueError):
    """A training/validation split that cannot be used; the message names the file."""


def _to_messages(value: Any) -> list[dict[str, Any]]:
    return [{"role": m["role"], "content": m["content"]} for m in value]


def read_conversations(path: str | Path, *, expand: bool, seed: int,
                       table: Any = None) -> list[list[dict[str, Any]]]:
    """The conversations of a split parquet, mixture-expanded when ``expand`` and a ``copies``
    column is present (one per conversation otherwise). ``table``: the file already read (a polars or
    pyarrow table; ``path`` then only names it in messages). Raises :class:`DataError` naming ``path``."""
    path = Path(path)
    if table is not None:
        table = table if isinstance(table, pl.DataFrame) else pl.from_arrow(table)   # a pyarrow Table too
        if "messages" not in table.columns:
            raise DataError(f"{path}: no `messages` column (columns: {table.columns})")
        df = table
    else:
        try:
            df = read_parquet(path, "split file", required=("messages",))
        except ParquetReadError as e:    # the job's own error type: a clear exit 2, naming the file
            raise DataError(str(e).replace("split file lacks column(s) ['messages']",
                                           "no `messages` column")) from None
    if df.is_empty():
        raise DataError(f"{path}: the split is empty (0 conversations); nothing to train or evaluate on")
    convs = [_to_messages(m) for m in df.get_column("messages").to_list()]
    if expand and "copies" in df.columns:
        order = expand_mixture(df.select(pl.col("copies")).with_row_index("_row"), seed).get_column("_row").to_list()
        if not order:
            raise DataError(f"{path}: the mixture `copies` are all 0; the expanded split is empty")
        convs = [convs[i] for i in order]
    return convs


def build_rows(
    tokenizer: Any,
    conversations: Sequence[Sequence[dict[str, Any]]],
    *,
    train_role: str,
    max_len: int,
    overlong: str,
    batching: str,
    source: str = "<conversations>",
    history: str = "full",
) -> tuple[list[PackedRow], dict[str, Any]]:
    """Tokenise, fit and pack (``batching="packed"``) or keep one example per row (``grouped``,
    ``padded``) ``conversations``; returns ``(rows, stats)``.

    Identical conversations (mixture copies) are tokenised once. A conversation the chat
    tokenisation rejects is skipped and counted (``tokenize_errors``, first message in
    ``first_tokenize_error``). ``stats`` also holds :func:`fit_examples`' counts, ``rows``,
    ``packing_efficiency`` (real tokens / (rows × max_len)), ``real_tokens`` and ``target_tokens``.

    ``history="public"``: every ``train_role`` turn is trained given the history as its partner saw it, its
    own earlier turns with their think blocks removed (:func:`public_history_example`: one prefix-tree
    example per conversation); ``"full"``: one causal example, earlier turns verbatim.
    """
    if batching not in BATCHING:
        raise ValueError(f"batching must be one of {BATCHING}, got {batching!r} (resolve `auto` first)")
    if history not in HISTORY:
        raise ValueError(f"history must be one of {HISTORY}, got {history!r}")
    keys = [tuple((m["role"], m["content"]) for m in c) for c in conversations]
    unique: dict[tuple, int] = {}
    for k in keys:
        unique.setdefault(k, len(unique))
    uniq_convs = [[{"role": r, "content": c} for r, c in k] for k in unique]
    if history == "public":
        results = public_history_examples(tokenizer, uniq_convs, train_role)
    else:
        results = tokenize_many(tokenizer, uniq_convs, train_role, errors="return")
    errors = [r for r in results if isinstance(r, Exception)]
    examples = [results[unique[k]] for k in keys if not isinstance(results[unique[k]], Exception)]
    kept, stats = fit_examples(examples, max_len, overlong)  # type: ignore[arg-type]
    if not kept:
        raise DataError(f"{source}: no example is left after tokenisation and fitting to max_len={max_len} "
                        f"(tokenize errors: {len(errors)}, stats: {stats})")
    rows = pack(kept, max_len) if batching == "packed" else pad_rows(kept, max_len)
    out: dict[str, Any] = dict(stats)
    out.update(
        conversations=len(conversations),
        tokenize_errors=sum(1 for k in keys if isinstance(results[unique[k]], Exception)),
        first_tokenize_error=str(errors[0]) if errors else None,
        rows=len(rows),
        batching=batching,
        packing_efficiency=packing_efficiency(rows, max_len),
        real_tokens=sum(len(r) for r in rows),
        target_tokens=sum(target_count(r) for r in rows),
    )
    return rows, out


def public_history_examples(tokenizer: Any, conversations: Sequence[Sequence[dict[str, Any]]],
                            train_role: str) -> list[Any]:
    """One prefix-tree example ``(input_ids, loss_mask, parents)`` per conversation (or its ``ValueError``):
    each ``train_role`` turn ``k`` is the target of the rendering of ``conv[:k]`` with every earlier
    ``train_role`` turn reduced to its public text (:func:`~mimesis_lab.envs.output_format.public_text`: think
    blocks removed, as the simulator's history holds them at rollout, SPEC §1 ``u(x | c, H)``) followed by
    turn ``k`` verbatim, ``<think>…</think>`` included. The turns share their common prefixes
    (:func:`~mimesis_lab.packing.tree_example`), so the public history is encoded once and each private
    reasoning only where its own turn reads it: about 1.1x the tokens of the verbatim conversation, where
    one row per turn costs 3.2x (the default ThoughtTrace split). A turn whose rendering does not extend the
    previous turn's context is an error of the chat template (reported as the conversation's error)."""
    from mimesis_lab.envs.output_format import public_text
    from mimesis_lab.packing import tree_example

    turns_of: list[list[int]] = []
    flat: list[list[dict[str, Any]]] = []
    for conv in conversations:
        idx = []
        for k, m in enumerate(conv):
            if m["role"] == train_role:
                ctx = [dict(x, content=public_text(x["content"])) if x["role"] == train_role else dict(x)
                       for x in conv[:k]]
                idx.append(len(flat))
                flat.append(ctx + [dict(m)])
        turns_of.append(idx)
    results = tokenize_many(tokenizer, flat, train_role, errors="return") if flat else []
    out: list[Any] = []
    for i, idx in enumerate(turns_of):
        if not idx:
            out.append(ValueError(f"conversation {i}: no {train_role} turn to train on"))
            continue
        err = next((results[j] for j in idx if isinstance(results[j], Exception)), None)
        if err is not None:
            out.append(ValueError(f"conversation {i}: {err}"))
            continue
        turns = []
        for j in idx:
            ids, mask = results[j]
            end = max((t for t, v in enumerate(mask) if v), default=-1) + 1   # the last target run: turn k
            start = end
            while start > 0 and mask[start - 1]:
                start -= 1
            if end == 0 or start == 0:
                continue                      # nothing to train on in this turn (e.g. empty content)
            turns.append((list(ids[:end]), start))
        if not turns:
            out.append(ValueError(f"conversation {i}: no target token in any {train_role} turn"))
            continue
        try:
            out.append(tree_example(turns))
        except ValueError as e:
            out.append(ValueError(f"conversation {i}: {e}"))
    return out


def load_rows(path: str | Path, tokenizer: Any, cfg: Any, *, train: bool, batching: str,
              table: Any = None) -> tuple[list[PackedRow], dict[str, Any]]:
    """:func:`read_conversations` + :func:`build_rows` with the settings of a ``TrainParams``
    (``batching``: the resolved mode, see :func:`resolve_batching`; ``table``: the file already read).
    :mod:`mimesis_lab.train.token_cache` caches the result."""
    convs = read_conversations(path, expand=train, seed=cfg.seed, table=table)
    return build_rows(tokenizer, convs, train_role=cfg.train_role, max_len=cfg.max_len,
                      overlong=cfg.overlong, batching=batching, source=str(path),
                      history=getattr(cfg, "history", "full"))


def resolve_batching(batching: str, device_type: str) -> str:
    """The batching mode to use: ``auto`` is ``packed`` on CUDA (block-diagonal packed rows are what
    a variable-length attention kernel runs without padding) and ``grouped`` elsewhere (on CPU the
    dense attention over a packed ``max_len`` row costs more than the padding it removes:
    ``bench/bench_packing.py``); any other value is returned as is."""
    if batching == "auto":
        return "packed" if device_type == "cuda" else "grouped"
    if batching not in BATCHING:
        raise ValueError(f"batching must be auto or one of {BATCHING}, got {batching!r}")
    return batching


def batch_units(rows: Sequence[PackedRow], batching: str, micro_batch: int, max_len: int,
                seed: int) -> tuple[list[list[int]], int]:
    """``(units, units_per_micro_step)``: the units :class:`DataPlan` shuffles (lists of row indices)
    and how many of them make one micro-step (module docstring, item 3). ``grouped``: length groups
    within ``micro_batch * max_len`` padded tokens, one per micro-step; else one row per unit and
    ``micro_batch`` units per micro-step."""
    if batching == "grouped":
        return group_by_length([len(r) for r in rows], micro_batch * max_len, seed), 1
    return [[i] for i in range(len(rows))], micro_batch


def batch_efficiency(rows: Sequence[PackedRow], units: Sequence[Sequence[int]], batching: str, max_len: int) -> float:
    """Real tokens / tokens fed to the model (pads included): each ``grouped`` unit is padded to its
    longest row, every other row to ``max_len``."""
    real = sum(len(rows[i]) for u in units for i in u)
    if batching == "grouped":
        fed = sum(len(u) * max(len(rows[i]) for i in u) for u in units if u)
    else:
        fed = sum(len(u) for u in units) * max_len
    return real / fed if fed else 0.0


def target_count(row: PackedRow) -> int:
    """Number of scored tokens (labels != -100) in a row."""
    return sum(1 for t in row.labels if t != IGNORE_INDEX)


@dataclass(frozen=True)
class DataPlan:
    """Which training units (rows, or length groups) each rank uses at each optimizer step (see the
    module docstring); ``n_rows`` counts units and ``micro_batch`` is in units per micro-step."""

    n_rows: int
    micro_batch: int
    grad_accum: int
    world_size: int
    seed: int
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("n_rows", "micro_batch", "grad_accum", "world_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DataPlan.{name} must be > 0, got {getattr(self, name)}")

    @property
    def global_batch(self) -> int:
        """Rows per optimizer step, all ranks and micro-steps together."""
        return self.micro_batch * self.grad_accum * self.world_size

    def total_steps(self, epochs: float, max_steps: int | None = None) -> int:
        """``max_steps`` if given, else ``ceil(epochs * n_rows / global_batch)``."""
        if max_steps is not None:
            return int(max_steps)
        return max(1, math.ceil(round(epochs * self.n_rows / self.global_batch, 9)))

    def steps_per_epoch(self) -> float:
        return self.n_rows / self.global_batch

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The seeded permutation of row indices for ``epoch``."""
        if epoch not in self._cache:
            if len(self._cache) > 4:
                self._cache.clear()
            self._cache[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n_rows)
        return self._cache[epoch]

    def epoch_at(self, step: int) -> float:
        """Epochs completed before optimizer step ``step`` (stream position / n_rows)."""
        return step * self.global_batch / self.n_rows

    def step_rows(self, step: int) -> list[int]:
        """The ``global_batch`` row indices of optimizer step ``step`` (0-based)."""
        start = step * self.global_batch
        out: list[int] = []
        for pos in range(start, start + self.global_batch):
            epoch, i = divmod(pos, self.n_rows)
            out.append(int(self.epoch_order(epoch)[i]))
        return out

    def micro_batches(self, step: int, rank: int) -> list[list[int]]:
        """``grad_accum`` lists of ``micro_batch`` row indices for ``rank`` at ``step``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world size {self.world_size}")
        rows = self.step_rows(step)
        per = self.world_size * self.micro_batch
        return [rows[k * per + rank * self.micro_batch: k * per + (rank + 1) * self.micro_batch]
                for k in range(self.grad_accum)]


def eval_batches(n_rows: int, micro_batch: int, world_size: int, rank: int) -> list[list[int]]:
    """Validation rows of ``rank``: every rank gets the same number of batches (some may be
    empty lists) so collective engines (ZeRO-3) never wait on a rank that has finished."""
    per = micro_batch * world_size
    n_batches = math.ceil(n_rows / per)
    return [[i for i in range(b * per + rank * micro_batch, b * per + (rank + 1) * micro_batch) if i < n_rows]
            for b in range(n_batches)]
