"""CSD — coached on-policy self-distillation — on top of multi-turn GRPO (SPEC §3.3).

After each rollout batch (:meth:`CSD.prepare`, the *post-pass*):

1. every trajectory in the update (not in a ``skip_gyms`` gym) has its agent turns aligned with
   the simulator's replies (:func:`turn_alignment`): for turn ``t``, ``z_t`` = the reasoning of the
   last simulator reply *before* the turn (``privileged[t-1]``; empty on the first turn) and
   ``x_{t+1}`` = the user's public reply *to* the turn (empty if the turn did not reach the user);
2. :func:`~mimesis_lab.rl.csd.select_turns` picks up to ``turns_per_trajectory`` turns, those with
   reasoning first;
3. the coach writes ``h_t = G(H_t, y_t, z_t, x_{t+1})`` (prospective: without ``y_t``); ``NONE``
   and failures are skipped and counted;
4. the **leak validator** drops (and counts) a note that reveals the episode's private facts
   (the gym's hidden task spec) — the reference has none;
5. the teacher row = public history before the turn + the note as a user message + the generation
   prompt + the **same sampled ids** (no new decoding); wider than ``max_teacher_tokens`` →
   skipped and counted;
6. placebo (default on): once the pool holds ``placebo_min_pool`` notes, a note with a different
   string **from another episode** gives a second teacher row for the same tokens.

In the update (:meth:`CSD.loss`, called by :func:`mimesis_lab.rl.job.ppo_update` per micro-chunk):
the teacher is the **current actor under** ``torch.no_grad()`` (dropout off, checked at set-up);
its left-padded rows are read through ``index_map``/``row_idx`` onto the student's grid and
``L = L_GRPO + alpha * csd_loss(student, teacher, sdpo_mask, beta, placebo)``.
"""
from __future__ import annotations

import dataclasses
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from mimesis_lab.judges.coach import CoachInput, check_coach_endpoint, make_coach
from mimesis_lab.judges.leak import LeakValidator, private_facts
from mimesis_lab.rl.csd import PlaceboPool, TeacherRow, build_teacher_row, gather_teacher_logp, pad_teacher_rows, \
    select_turns, teacher_index
from mimesis_lab.rl.losses import csd_loss

__all__ = ["CSD", "CSDStep", "turn_alignment", "history_before", "turn_positions", "teacher_logprobs",
           "teacher_logprobs_from_prefix", "cache_layers"]

COUNTERS = ("trajectories", "trajectories_skipped_gym", "turns", "turns_selected", "coach_ok", "coach_none",
            "coach_failure", "leaks_dropped", "rows", "rows_skipped_width", "placebo_rows", "placebo_unavailable")


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
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    logits = out.logits[:, :-1, :].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Detached per-layer ``(keys, values)`` ``[B, kv_heads, T, d]`` of a forward's KV cache."""
    if hasattr(cache, "layers"):
        return [(layer.keys.detach(), layer.values.detach()) for layer in cache.layers]
    return [(k.detach(), v.detach()) for k, v in cache]   # legacy tuple layout


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
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, cache=DynamicCache(layers),
                use_cache=False)
    logits = out.logits[:, :-1, :].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    suffix_rows = [dataclasses.replace(r, input_ids=tuple(suf), teacher_positions=tuple(q - p for q in
                                                                                     r.teacher_positions))
                   for r, suf, p in zip(rows, suffixes, cut)]
    return logp, suffix_rows


@dataclass
class CSDStep:
    """One step's teacher rows (keyed by rollout id; ``student_row`` is set per micro-chunk)."""

    rows: dict[str, list[TeacherRow]] = field(default_factory=dict)
    placebo: dict[str, list[TeacherRow]] = field(default_factory=dict)
    counts: Counter = field(default_factory=Counter)


class CSD:
    """The post-pass and the loss term of one CSD job (state: the coach, the placebo pool)."""

    def __init__(self, cfg: Any, tokenizer: Any, tasks: dict[str, dict[str, Any]], pad_id: int,
                 forbidden_urls: Sequence[str] = ()):
        self.cfg = cfg.csd
        self.alpha = float(self.cfg.alpha)
        self.tokenizer = tokenizer
        self.tasks = tasks
        self.pad_id = pad_id
        if self.cfg.coach.kind == "openai":
            check_coach_endpoint(self.cfg.coach.openai.base_url, list(forbidden_urls))
        self.coach = make_coach(self.cfg.coach.kind, self.cfg.coach.openai, self.cfg.coach.style)
        self.pool = PlaceboPool(min_size=self.cfg.placebo_min_pool)
        self.step: CSDStep = CSDStep()
        self._leaks: dict[tuple[str, str], LeakValidator] = {}

    def close(self) -> None:
        self.coach.close()

    # -- the post-pass ----------------------------------------------------------------------------
    def _validator(self, gym: str, task_id: str) -> LeakValidator | None:
        key = (gym, task_id)
        if key not in self._leaks:
            task = (self.tasks.get(gym) or {}).get(task_id)
            self._leaks[key] = LeakValidator(private_facts(gym, task)) if task is not None else None
        return self._leaks[key]

    def prepare(self, trajs: Sequence[Any], in_update: set[str], privileged: dict[str, list[str]],
                replies: dict[str, list[str]], rng: random.Random) -> CSDStep:
        """Coach the selected turns of the trajectories in the update; build the teacher rows."""
        st = CSDStep()
        c = st.counts
        if self.alpha <= 0:
            self.step = st
            return st
        jobs: list[tuple[Any, int, CoachInput]] = []
        for tr in trajs:
            if tr.traj_id not in in_update:
                continue
            gym = tr.data_source.removeprefix("interact_")
            c["trajectories"] += 1
            c["turns"] += len(tr.turns)
            if gym in self.cfg.skip_gyms:
                c["trajectories_skipped_gym"] += 1
                continue
            align = turn_alignment(tr.turns, privileged.get(tr.traj_id, []), replies.get(tr.traj_id, []))
            chosen = select_turns([bool(z.strip()) for z, _ in align], self.cfg.turns_per_trajectory,
                                  self.cfg.require_reply, rng)
            for t in chosen:
                if not tr.turns[t].token_ids:
                    continue
                z, x = align[t]
                jobs.append((tr, t, CoachInput(history_before(tr.messages, t), z, x, tr.turns[t].text, gym)))
        c["turns_selected"] += len(jobs)
        if self.cfg.coach.kind == "openai" and len(jobs) > 1:
            with ThreadPoolExecutor(max_workers=8) as pool:
                results = list(pool.map(lambda j: self.coach.coach(j[2]), jobs))
        else:
            results = [self.coach.coach(j[2]) for j in jobs]
        notes: list[tuple[Any, int, CoachInput, str]] = []
        for (tr, t, inp), res in zip(jobs, results):
            if res.status != "ok" or not res.note:
                c["coach_none" if res.status == "none" else "coach_failure"] += 1
                continue
            c["coach_ok"] += 1
            if self.cfg.leak_check:
                v = self._validator(inp.gym, tr.task_id)
                if v is not None and v.check(res.note):
                    c["leaks_dropped"] += 1
                    continue
            notes.append((tr, t, inp, res.note))
        for tr, _, _, note in notes:
            self.pool.add(note, tr.traj_id)
        width = self.cfg.max_teacher_tokens
        for tr, t, inp, note in notes:
            ids = tr.turns[t].token_ids
            pos = turn_positions(tr)[t]
            row = build_teacher_row(self.tokenizer, inp.history, note, ids, student_row=0, student_positions=pos,
                                    max_len=width, traj_id=tr.traj_id, turn=t)
            if row is None:
                c["rows_skipped_width"] += 1
                continue
            st.rows.setdefault(tr.traj_id, []).append(row)
            c["rows"] += 1
            if not self.cfg.placebo:
                continue
            other = self.pool.draw(note, tr.traj_id, rng)
            prow = None if other is None else build_teacher_row(
                self.tokenizer, inp.history, other, ids, student_row=0, student_positions=pos, max_len=width,
                traj_id=tr.traj_id, turn=t)
            if prow is None:
                c["placebo_unavailable"] += 1
            else:
                st.placebo.setdefault(tr.traj_id, []).append(prow)
                c["placebo_rows"] += 1
        self.step = st
        return st

    def metrics(self) -> dict[str, float]:
        c = self.step.counts
        out = {f"csd/{k}": float(c.get(k, 0)) for k in COUNTERS}
        out["csd/coached_turn_share"] = c.get("rows", 0) / c["turns"] if c.get("turns") else 0.0
        return out

    # -- the loss term (called by ppo_update) -----------------------------------------------------
    def tokens(self, row: Any) -> int:
        return sum(len(r.teacher_positions) for r in self.step.rows.get(row.rollout_id, []))

    @property
    def needs_cache(self) -> bool:
        """Whether ppo_update hands over the student forward's KV cache (``batch["kv"]``)."""
        return bool(self.cfg.teacher_cache)

    def _teacher_grid(self, engine, rows: list[TeacherRow], n_student: int, width: int, device,
                      batch: dict[str, Any] | None = None) -> tuple:
        """Teacher log-probs on the student grid (NaN where not coached) and the mask; one forward
        always runs (a 1x2 dummy when there is no row) so ranks stay in step under ZeRO-3.

        With the student's KV cache in ``batch["kv"]`` only each row's suffix (note + the same ids)
        is computed (:func:`teacher_logprobs_from_prefix`); otherwise the full left-padded rows."""
        if not rows:
            dummy = torch.full((1, 2), int(self.pad_id), dtype=torch.long, device=device)
            teacher_logprobs(engine, dummy, torch.ones_like(dummy))
            return None, None
        if batch is not None and batch.get("kv") is not None:
            res = teacher_logprobs_from_prefix(engine, rows, batch["input_ids"], batch["kv"], self.pad_id)
            if res is not None:
                lp, cut = res
                idx = teacher_index(cut, [0] * len(cut), n_student, width)
                idx = {k: v.to(device) for k, v in idx.items()}
                return gather_teacher_logp(lp, idx), idx["sdpo_mask"]
        tb = pad_teacher_rows(rows, self.pad_id, device)
        lp = teacher_logprobs(engine, tb["input_ids"], tb["attention_mask"])
        idx = teacher_index(rows, tb["left_pad"].cpu(), n_student, width)
        idx = {k: v.to(device) for k, v in idx.items()}
        return gather_teacher_logp(lp, idx), idx["sdpo_mask"]

    def loss(self, engine, chunk_rows: Sequence[Any], batch: dict[str, torch.Tensor], logp: torch.Tensor
             ) -> tuple[torch.Tensor, float, dict[str, float]]:
        """``(csd_loss token-mean over this chunk's coached tokens, their count, stat sums)``."""
        device = logp.device
        n_student, width = batch["input_ids"].shape
        real = [dataclasses.replace(r, student_row=j) for j, row in enumerate(chunk_rows)
                for r in self.step.rows.get(row.rollout_id, [])]
        plac = [dataclasses.replace(r, student_row=j) for j, row in enumerate(chunk_rows)
                for r in self.step.placebo.get(row.rollout_id, [])]
        with torch.no_grad():
            teacher, mask = self._teacher_grid(engine, real, n_student, width, device, batch)
            placebo, _ = self._teacher_grid(engine, plac, n_student, width, device, batch) if self.cfg.placebo \
                else (None, None)
        if teacher is None:
            return logp.sum() * 0.0, 0.0, {}
        value = csd_loss(logp, torch.nan_to_num(teacher, nan=0.0), mask, beta=self.cfg.beta, placebo_logp=placebo)
        with torch.no_grad():
            sel = mask != 0
            s = logp.detach()[sel]
            t = teacher[sel]
            base = s
            n_plac = 0.0
            if placebo is not None:
                p = placebo[sel]
                has = ~torch.isnan(p)
                base = torch.where(has, p, s)
                n_plac = float(has.sum())
            delta = t - base
            gate = torch.sigmoid(self.cfg.beta * delta)
            n = float(sel.sum())
            stats = {"loss_sum": float(value.detach()) * n, "tokens": n, "gate_sum": float(gate.sum()),
                     "delta_sum": float(delta.sum()), "placebo_tokens": n_plac,
                     "teacher_minus_student_sum": float((t - s).sum())}
        return value, n, stats
