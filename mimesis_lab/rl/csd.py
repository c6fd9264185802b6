"""CSD building blocks: turn selection, teacher rows, index maps, placebo pool (SPEC §3.3).

Names follow the paper / reference code (code name ``sdpo``, notes = ``hint``):

* **Turn selection** (item 2) — :func:`select_turns`: after the rollout, prefer agent turns whose
  preceding simulator reasoning exists, fill from the rest (``REQUIRE_REPLY=0`` by default).
* **Teacher rows** (item 4) — :func:`build_teacher_row`: the public conversation before the
  coached assistant turn + the note ``h_t`` as an extra user message + the generation prompt,
  then the **same sampled token ids** ``y_ids`` (no new decoding). Rows longer than the width
  are skipped (``None``). :func:`pad_teacher_rows` left-pads them; :func:`teacher_index` builds,
  on the student's shifted grid ``[B, T-1]``, ``row_idx`` (which teacher row), ``index_map``
  (the token's position on the teacher's shifted grid ``[R, W-1]``, shifted by the left padding)
  and ``sdpo_mask`` (the coached tokens); :func:`gather_teacher_logp` reads the teacher's
  log-probs through them.
* **Alignment** (items 2–3) — :func:`turn_alignment` pairs each agent turn with ``z_t`` (the
  reasoning of the user's reply before it) and ``x_{t+1}`` (the user's public reply to it);
  :func:`history_before` and :func:`turn_positions` locate the turn in the public conversation and
  in the trajectory's token stream.
* **Teacher log-probs** (item 5) — :func:`teacher_logprobs` scores left-padded teacher rows;
  :func:`teacher_logprobs_from_prefix` scores only each row's note + response on top of the
  student forward's KV cache of the shared history (same result, less compute).
* **Placebo correction** (item 7) — :class:`PlaceboPool`: valid notes of earlier episodes; once it
  holds ≥ 8, a note with a different string (and, unlike the reference, from a different episode)
  is drawn for an extra teacher row, and the gate uses ``delta = t[real note] - t[placebo note]``.

Shifted grid (as in :mod:`mimesis_lab.rl.policy`): ``logp[b, t] = log p(ids[t+1] | ids[:t+1])``,
so the token at position ``p`` of a row sits at grid index ``p - 1``. Placebo rows cover the same
student tokens as the real rows: index them with a separate :func:`teacher_index` call.
"""
from __future__ import annotations

import dataclasses
import random
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from mimesis_lab.rl.policy import token_logprobs

__all__ = ["select_turns", "TeacherRow", "build_teacher_row", "pad_teacher_rows", "teacher_index",
           "gather_teacher_logp", "PlaceboPool", "turn_alignment", "history_before", "turn_positions",
           "teacher_logprobs", "teacher_logprobs_from_prefix"]


def select_turns(has_reasoning: list[bool], k: int, require_reply: bool = False,
                 rng: random.Random | None = None) -> list[int]:
    """Up to ``k`` agent-turn indices of one trajectory to coach (sorted).

    Turns whose preceding simulator reasoning exists (``has_reasoning[i]``) come first; the rest
    fill the remaining slots unless ``require_reply``. Within each group the choice is
    ``rng.sample`` (deterministic for a seeded ``rng``) or, without ``rng``, in turn order.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    with_r = [i for i, h in enumerate(has_reasoning) if h]
    without = [] if require_reply else [i for i, h in enumerate(has_reasoning) if not h]

    def take(pool: list[int], n: int) -> list[int]:
        n = min(n, len(pool))
        return rng.sample(pool, n) if rng is not None else pool[:n]

    chosen = take(with_r, k)
    chosen += take(without, k - len(chosen))
    return sorted(chosen)


@dataclass(frozen=True)
class TeacherRow:
    """One coached teacher row: ``input_ids`` (unpadded) = rendering of ``H_t + [note]`` + ``y_ids``;
    ``teacher_positions[j]`` / ``student_positions[j]`` are the positions of response token ``j``
    in this row and in student row ``student_row``."""

    input_ids: tuple[int, ...]
    teacher_positions: tuple[int, ...]
    student_row: int
    student_positions: tuple[int, ...]
    traj_id: str = ""
    turn: int = 0
    note: str = ""


def build_teacher_row(tokenizer: Any, history: list[dict], note: str, response_ids: list[int], *,
                      student_row: int, student_positions: list[int], max_len: int, traj_id: str = "",
                      turn: int = 0) -> TeacherRow | None:
    """Teacher row of one coached turn (SPEC §3.3 item 4), or ``None`` if longer than ``max_len``.

    ``prefix = encode(apply_chat_template(history + [{"role": "user", "content": note}],
    add_generation_prompt=True))``; ``input_ids = prefix + response_ids`` (the student's sampled
    ids, never re-decoded), ``teacher_positions = len(prefix) + j``.
    """
    if len(response_ids) != len(student_positions):
        raise ValueError(f"{len(response_ids)} response ids but {len(student_positions)} student positions "
                         f"(trajectory {traj_id!r}, turn {turn})")
    if not response_ids:
        raise ValueError(f"empty response (trajectory {traj_id!r}, turn {turn})")
    messages = [dict(m) for m in history] + [{"role": "user", "content": note}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prefix = list(tokenizer.encode(text, add_special_tokens=False))
    ids = prefix + [int(i) for i in response_ids]
    if len(ids) > max_len:
        return None
    start = len(prefix)
    return TeacherRow(tuple(ids), tuple(range(start, len(ids))), int(student_row),
                      tuple(int(p) for p in student_positions), traj_id, int(turn), note)


def pad_teacher_rows(rows: Sequence[TeacherRow], pad_id: int, device: torch.device | str = "cpu"
                     ) -> dict[str, torch.Tensor]:
    """LEFT-pad teacher rows to width ``W``: ``input_ids``/``attention_mask`` ``[R, W]``, ``left_pad [R]``."""
    if not rows:
        raise ValueError("no teacher rows to pad")
    width = max(len(r.input_ids) for r in rows)
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    left = torch.zeros(len(rows), dtype=torch.long)
    for i, r in enumerate(rows):
        pad = width - len(r.input_ids)
        ids[i, pad:] = torch.tensor(r.input_ids, dtype=torch.long)
        attn[i, pad:] = 1
        left[i] = pad
    return {k: v.to(device) for k, v in {"input_ids": ids, "attention_mask": attn, "left_pad": left}.items()}


def teacher_index(rows: Sequence[TeacherRow], left_pad: torch.Tensor | Sequence[int], n_student_rows: int,
                  student_width: int) -> dict[str, torch.Tensor]:
    """Index maps on the student's shifted grid ``[B, T-1]`` (``B = n_student_rows``, ``T = student_width``).

    For response token ``j`` of teacher row ``r`` at student position ``p`` (grid ``p - 1``) and
    teacher position ``q``: ``row_idx = r``, ``index_map = q - 1 + left_pad[r]`` (its index on the
    teacher's shifted grid ``[R, W-1]``), ``sdpo_mask = 1``; elsewhere ``-1, -1, 0``.
    Raises on a token coached twice or a position outside the rows.
    """
    pads = [int(x) for x in (left_pad.tolist() if isinstance(left_pad, torch.Tensor) else left_pad)]
    if len(pads) != len(rows):
        raise ValueError(f"{len(rows)} teacher rows but {len(pads)} left-pad values")
    shape = (n_student_rows, student_width - 1)
    row_idx = torch.full(shape, -1, dtype=torch.long)
    index_map = torch.full(shape, -1, dtype=torch.long)
    for r, (row, pad) in enumerate(zip(rows, pads)):
        if not 0 <= row.student_row < n_student_rows:
            raise ValueError(f"teacher row {r}: student row {row.student_row} outside 0..{n_student_rows - 1}")
        if len(row.teacher_positions) != len(row.student_positions):
            raise ValueError(f"teacher row {r}: {len(row.teacher_positions)} teacher positions but "
                             f"{len(row.student_positions)} student positions")
        for q, p in zip(row.teacher_positions, row.student_positions):
            if not 1 <= p < student_width or not 1 <= q < len(row.input_ids):
                raise ValueError(f"teacher row {r}: student position {p} (width {student_width}) or teacher "
                                 f"position {q} (length {len(row.input_ids)}) has no predicting logit")
            if row_idx[row.student_row, p - 1] >= 0:
                raise ValueError(f"student row {row.student_row} position {p} is coached twice (teacher rows "
                                 f"{int(row_idx[row.student_row, p - 1])} and {r}); index placebo rows separately")
            row_idx[row.student_row, p - 1] = r
            index_map[row.student_row, p - 1] = q - 1 + pad
    return {"row_idx": row_idx, "index_map": index_map, "sdpo_mask": (row_idx >= 0).float()}


def gather_teacher_logp(teacher_logp: torch.Tensor, index: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[B, T-1]`` teacher log-probs read through :func:`teacher_index`; NaN where not coached
    (directly usable as ``placebo_logp``; for the teacher use ``torch.nan_to_num`` with ``sdpo_mask``)."""
    row_idx = index["row_idx"].to(teacher_logp.device)
    index_map = index["index_map"].to(teacher_logp.device)
    out = torch.full(row_idx.shape, float("nan"), dtype=teacher_logp.dtype, device=teacher_logp.device)
    sel = row_idx >= 0
    if sel.any():
        out[sel] = teacher_logp[row_idx[sel], index_map[sel]]
    return out


class PlaceboPool:
    """FIFO pool of valid coaching notes for the placebo correction (SPEC §3.3 item 7).

    :meth:`draw` returns ``None`` until the pool holds ``min_size`` notes, then a uniformly drawn
    note whose string differs from ``note`` **and** whose episode differs from ``episode`` (the
    reference only compares strings), or ``None`` if none qualifies. Beyond ``capacity`` the
    oldest notes are evicted.
    """

    def __init__(self, min_size: int = 8, capacity: int = 512):
        if min_size < 1 or capacity < min_size:
            raise ValueError(f"need 1 <= min_size <= capacity, got min_size={min_size}, capacity={capacity}")
        self.min_size = min_size
        self.items: deque[tuple[str, str]] = deque(maxlen=capacity)

    def add(self, note: str, episode: str) -> None:
        if note and note.strip():
            self.items.append((note, str(episode)))

    def __len__(self) -> int:
        return len(self.items)

    def draw(self, note: str, episode: str, rng: random.Random) -> str | None:
        if len(self.items) < self.min_size:
            return None
        pool = [n for n, e in self.items if n != note and e != str(episode)]
        return rng.choice(pool) if pool else None


def turn_alignment(turns: Sequence[Any], reasoning: Sequence[str], replies: Sequence[str]) -> list[tuple[str, str]]:
    """``(z_t, x_{t+1})`` per agent turn from the cumulative reply counts ``turn.user_replies``.

    ``reasoning[k]`` / ``replies[k]`` are the private reasoning / public content of the user's
    ``k``-th reply (the shim stores an explicit empty entry for a reply without reasoning, so both
    lists stay aligned)."""
    out, before = [], 0
    for t in turns:
        z = reasoning[before - 1] if 0 < before <= len(reasoning) else ""
        x = replies[before] if t.user_replies > before and before < len(replies) else ""
        out.append((z or "", x or ""))
        before = t.user_replies
    return out


def history_before(messages: Sequence[dict], turn: int) -> list[dict]:
    """The public messages before the ``turn``-th assistant message (0-based)."""
    n = 0
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            if n == turn:
                return [dict(x) for x in messages[:i]]
            n += 1
    raise ValueError(f"no assistant message number {turn} ({n} in the conversation)")


def turn_positions(traj: Any) -> list[list[int]]:
    """Positions in ``traj.ids`` of each turn's generated tokens."""
    out, at = [], len(traj.prompt_ids)
    for t in traj.turns:
        out.append(list(range(at, at + len(t.token_ids))))
        at += len(t.token_ids) + len(t.env_ids)
    return out


def teacher_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[R, W-1]`` next-token log-probs of LEFT-padded rows: positions restart at each row's first
    real token, so a padded row scores exactly like the unpadded one."""
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
    return token_logprobs(model, input_ids, attention_mask, position_ids=position_ids)


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def teacher_logprobs_from_prefix(model, rows: Sequence[TeacherRow], student_ids: torch.Tensor,
                                 student_kv: list[tuple[torch.Tensor, torch.Tensor]], pad_id: int
                                 ) -> tuple[torch.Tensor, list[TeacherRow]] | None:
    """Teacher log-probs computing only each row's *suffix* (note + the same ids) on top of the
    student's own KV cache for the shared history prefix.

    A teacher row is the public history before the coached turn (which is also the student row's
    prefix), the note and the response ids; the history's keys/values under the same weights are
    already in the student forward's cache (a causal model's KV at position ``p`` depends only on
    tokens ``<= p``), so they are sliced from it (left-padded to a common length) instead of being
    recomputed. Returns ``(logp [R, S-1], suffix_rows)`` where ``suffix_rows`` are the rows cut to
    their suffixes (positions shifted, right-padded: index them with ``left_pad = 0``), or ``None``
    when some row shares no prefix with its student row (the caller then scores full rows).
    """
    from transformers import DynamicCache

    device = student_ids.device
    cut = []
    for r in rows:
        p = _common_prefix(r.input_ids, student_ids[r.student_row].tolist(), r.teacher_positions[0] - 1)
        if p < 1:
            return None
        cut.append(p)
    p_max = max(cut)
    suffixes = [r.input_ids[p:] for r, p in zip(rows, cut)]
    s_max = max(len(x) for x in suffixes)
    n = len(rows)
    ids = torch.full((n, s_max), int(pad_id), dtype=torch.long, device=device)
    attn = torch.zeros((n, p_max + s_max), dtype=torch.long, device=device)
    pos = torch.zeros((n, s_max), dtype=torch.long, device=device)
    for i, (suf, p) in enumerate(zip(suffixes, cut)):
        ids[i, :len(suf)] = torch.tensor(suf, dtype=torch.long, device=device)
        attn[i, p_max - p:p_max] = 1
        attn[i, p_max:p_max + len(suf)] = 1
        pos[i] = p + torch.arange(s_max, device=device)
    layers = []
    for k, v in student_kv:
        kk = k.new_zeros((n, k.shape[1], p_max, k.shape[3]))
        vv = v.new_zeros((n, v.shape[1], p_max, v.shape[3]))
        for i, (r, p) in enumerate(zip(rows, cut)):
            kk[i, :, p_max - p:] = k[r.student_row, :, :p]
            vv[i, :, p_max - p:] = v[r.student_row, :, :p]
        layers.append((kk, vv))
    logp = token_logprobs(model, ids, attn, position_ids=pos, cache=DynamicCache(layers))
    suffix_rows = [dataclasses.replace(r, input_ids=tuple(suf), teacher_positions=tuple(q - p for q in
                                                                                     r.teacher_positions))
                   for r, suf, p in zip(rows, suffixes, cut)]
    return logp, suffix_rows
