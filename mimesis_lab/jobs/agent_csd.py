"""Agent multi-turn GRPO + CSD, coached on-policy self-distillation (SPEC §3.3).

Launch (one process per rank; the training flow does this for ``dvc repro``)::

    deepspeed --num_gpus 1 --module mimesis_lab.jobs.agent_csd --params params.yaml
    python -m mimesis_lab.jobs.agent_csd                            # world size 1, no launcher

The GRPO recipe (``mimesis_lab.jobs.agent_grpo``: same trajectories, same rows, same PPO-clip term)
plus, per step:

1. **The post-pass** (:meth:`CSD.prepare`): every trajectory in the update (not in a ``skip_gyms``
   gym) has its agent turns aligned with the simulator's replies (``z_t`` = the reasoning of the
   user's reply before turn ``t``, empty on the first turn; ``x_{t+1}`` = the user's public reply to
   it); up to ``turns_per_trajectory`` turns are selected (those with reasoning first); the coach
   writes ``h_t = G(H_t, y_t, z_t, x_{t+1})`` (prospective: without ``y_t``; ``NONE`` and failures
   are skipped and counted); the **leak validator** drops a note that reveals the episode's hidden
   task (the reference has none); the teacher row = public history + the note as a user message +
   the generation prompt + the **same sampled ids**; placebo rows use a note of another episode.
2. **The loss** (:func:`csd_update`), written out here::

       loss = ppo_clip_loss(...) + alpha * csd_loss(student, teacher, sdpo_mask, beta, placebo)

   each a token mean over its own tokens of the minibatch on all ranks. The teacher is the
   **current actor under** ``torch.no_grad()`` (dropout off, checked at set-up), scored on the
   student's KV cache of the shared history when ``teacher_cache`` is on. The gate and its
   statistics come from :func:`~mimesis_lab.rl.losses.csd_gate`.

MLflow shows the ``csd/*`` counters (coached turn share, coach NONE/failures, leaks dropped, rows
skipped, placebo rows) and the loss statistics (``csd/loss``, ``csd/gate_mean``, ``csd/delta_mean``), and per
kind of note (:data:`NOTE_KINDS`) the real − placebo log-prob a token (``csd/placebo_delta_mean/<kind>`` over
``csd/placebo_tokens/<kind>``): which notes the teacher reads.
"""
from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from mimesis_lab.jobs.agent_grpo import SUMMARY_KEYS as GRPO_SUMMARY_KEYS
from mimesis_lab.envs.gyms.base import gym_name
from mimesis_lab.jobs.agent_grpo import agent_inputs, load_training_rows, step_metrics
from mimesis_lab.judges.coach import NOTES, RECOMMENDS, CoachInput, check_coach_endpoint, make_coach
from mimesis_lab.judges.leak import LeakValidator, private_facts
from mimesis_lab.rl.agent_batch import build_agent_rows
from mimesis_lab.rl.csd import (PlaceboPool, TeacherRow, build_teacher_row, gather_teacher_logp, history_before,
                                pad_teacher_rows, select_turns, teacher_index, teacher_logprobs,
                                teacher_logprobs_from_prefix, turn_alignment, turn_positions)
from mimesis_lab.rl.losses import csd_gate, csd_loss
from mimesis_lab.rl.policy import micro_chunks, minibatch_plan, pad_update_rows, policy_state_dict, token_logprobs
from mimesis_lab.rl.ppo import (PPOStats, Replay, chunk_policy_loss, kl_weight, ppo_update, ptx_pass, rollout_summary,
                                start_policy_job)
from mimesis_lab.train.runtime import all_reduce, gather, job_main, set_lr
from mimesis_lab.train.schedule import lr_at
from mimesis_lab.train.step_run import StepRun

__all__ = ["CSD", "CSDStep", "NOTE_KINDS", "note_kind", "csd_update", "train_agent_csd", "main"]

COUNTERS = ("trajectories", "trajectories_skipped_gym", "turns", "turns_selected", "coach_ok", "coach_none",
            "coach_failure", "leaks_dropped", "rows", "rows_skipped_width", "placebo_rows", "placebo_unavailable")
#: Kinds of note the per-kind statistics split by: a note's leading cue of the template coach, split for a cue that
#: recommends an action (:data:`RECOMMENDS`) by whether the sampled reply took it (``_followed``) or not
#: (``_not_followed``) — a teacher that reads the note raises the one and lowers the other; ``other`` for notes
#: without a cue (an LLM coach's).
NOTE_KINDS = tuple(k2 for k in NOTES for k2 in ((f"{k}_followed", f"{k}_not_followed") if k in RECOMMENDS else (k,))) \
    + ("other",)

LOSS_STATS = ("loss_sum", "tokens", "gate_sum", "delta_sum", "placebo_tokens", "teacher_minus_student_sum",
              *(f"{s}/{k}" for k in NOTE_KINDS for s in ("placebo_delta_sum", "placebo_tokens")))
SUMMARY_KEYS = GRPO_SUMMARY_KEYS + ("csd/loss", "csd/gate_mean", "csd/coached_turn_share")
SHOW = ("reward/mean", "invalid_total", "tool_call_error_rate", "update/ppo_loss", "csd/loss",
        "csd/coached_turn_share")


def note_kind(cue: str, choice: str | None) -> int:
    """Index in :data:`NOTE_KINDS` of a note led by ``cue`` (``CoachResult.kind``) before a reply whose tool call
    chose ``choice``."""
    if cue in RECOMMENDS:
        cue = f"{cue}_followed" if choice == RECOMMENDS[cue] else f"{cue}_not_followed"
    return NOTE_KINDS.index(cue) if cue in NOTE_KINDS else len(NOTE_KINDS) - 1


@dataclass
class CSDStep:
    """One step's teacher rows (keyed by rollout id; ``student_row`` is set per micro-chunk) and, beside each
    row, the index of its note's kind in :data:`NOTE_KINDS`."""

    rows: dict[str, list[TeacherRow]] = field(default_factory=dict)
    kinds: dict[str, list[int]] = field(default_factory=dict)
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
            gym = gym_name(tr.data_source) or tr.data_source.removeprefix("interact_")
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
        notes: list[tuple[Any, int, CoachInput, str, int]] = []
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
            notes.append((tr, t, inp, res.note, note_kind(res.kind, tr.turns[t].choice)))
        for tr, _, _, note, _ in notes:
            self.pool.add(note, tr.traj_id)
        width = self.cfg.max_teacher_tokens
        for tr, t, inp, note, kind in notes:
            ids = tr.turns[t].token_ids
            pos = turn_positions(tr)[t]
            row = build_teacher_row(self.tokenizer, inp.history, note, ids, student_row=0, student_positions=pos,
                                    max_len=width, traj_id=tr.traj_id, turn=t)
            if row is None:
                c["rows_skipped_width"] += 1
                continue
            st.rows.setdefault(tr.traj_id, []).append(row)
            st.kinds.setdefault(tr.traj_id, []).append(kind)
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

    # -- the loss term (called by csd_update) -----------------------------------------------------
    def tokens(self, row: Any) -> int:
        return sum(len(r.teacher_positions) for r in self.step.rows.get(row.rollout_id, []))

    def need(self, chunk_rows: Sequence[Any], mask: torch.Tensor) -> torch.Tensor:
        """``[B, T-1]`` bool: where the chunk's student log-probs are read, the PPO ``mask`` and every coached
        token (grid position ``p - 1`` of student position ``p``), for :func:`token_logprobs`' ``need``. A placebo
        row is built only beside its coached row, at the same student positions, so the coached rows cover it."""
        grid = mask != 0
        for j, row in enumerate(chunk_rows):
            for r in self.step.rows.get(row.rollout_id, []):
                for p in r.student_positions:
                    grid[j, p - 1] = True
        return grid

    @property
    def needs_cache(self) -> bool:
        """Whether csd_update hands over the student forward's KV cache (``batch["kv"]``)."""
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
        kinds = [k for row in chunk_rows for k in self.step.kinds.get(row.rollout_id, [])]
        plac = [dataclasses.replace(r, student_row=j) for j, row in enumerate(chunk_rows)
                for r in self.step.placebo.get(row.rollout_id, [])]
        with torch.no_grad():
            teacher, mask = self._teacher_grid(engine, real, n_student, width, device, batch)
            placebo, _ = self._teacher_grid(engine, plac, n_student, width, device, batch) if self.cfg.placebo \
                else (None, None)
        if teacher is None:
            return logp.sum() * 0.0, 0.0, {}
        teacher = torch.nan_to_num(teacher, nan=0.0)
        value = csd_loss(logp, teacher, mask, beta=self.cfg.beta, placebo_logp=placebo)
        with torch.no_grad():
            sel = mask != 0
            gate, delta = csd_gate(logp, teacher, mask, beta=self.cfg.beta, placebo_logp=placebo)
            n = float(sel.sum())
            n_plac = float((~torch.isnan(placebo[sel])).sum()) if placebo is not None else 0.0
            stats = {"loss_sum": float(value.detach()) * n, "tokens": n, "gate_sum": float(gate[sel].sum()),
                     "delta_sum": float(delta[sel].sum()), "placebo_tokens": n_plac,
                     "teacher_minus_student_sum": float((teacher[sel] - logp.detach()[sel]).sum())}
            if placebo is not None:
                stats.update(_by_kind(real, kinds, sel & ~torch.isnan(placebo), delta))
        return value, n, stats


def _by_kind(rows: Sequence[TeacherRow], kinds: Sequence[int], has_placebo: torch.Tensor, delta: torch.Tensor
             ) -> dict[str, float]:
    """Per kind of note: the sum of ``delta`` (real − placebo note) and the count over the coached tokens with a
    placebo log-prob; a teacher row's tokens sit at student-grid positions ``p - 1`` of its student row."""
    grid = torch.full(has_placebo.shape, -1, dtype=torch.long, device=has_placebo.device)
    for r, k in zip(rows, kinds):
        for p in r.student_positions:
            grid[r.student_row, p - 1] = k
    out: dict[str, float] = {}
    for i, name in enumerate(NOTE_KINDS):
        sel = has_placebo & (grid == i)
        out[f"placebo_tokens/{name}"] = float(sel.sum())
        out[f"placebo_delta_sum/{name}"] = float(delta[sel].sum())
    return out


def csd_update(engine, rows, csd: CSD, cfg: Any, rng: random.Random, pad_id: int, world: int, ref: Any = None,
               replay: Replay | None = None) -> dict[str, float]:
    """PPO clip passes with the CSD term: per minibatch, ``L = L_PPO + alpha * L_CSD``, each the token
    mean over its own tokens on all ranks (``L_CSD`` over the coached tokens ``csd.tokens(row)``), plus
    ``kl_coef * L_KL`` over the PPO tokens where ``cfg.kl_coef > 0`` (``ref``: the frozen initial policy)
    and ``ptx_coef * L_SFT`` per optimizer step where ``replay`` is given (:func:`~mimesis_lab.rl.ppo.ptx_pass`),
    as in GRPO. Same passes, minibatches and zero-weight passes as :func:`mimesis_lab.rl.ppo.ppo_update`."""
    if csd.alpha <= 0:                         # alpha = 0 is the GRPO baseline
        return ppo_update(engine, rows, cfg, rng, pad_id, world, ref=ref, replay=replay)
    kl_coef = kl_weight(cfg, ref)
    stats = PPOStats(with_ref=kl_coef > 0)
    loss_stats = dict.fromkeys(LOSS_STATS, 0.0)
    first = True
    for _ in range(cfg.ppo_epochs):
        for part in minibatch_plan(len(rows), cfg.minibatches, rng):
            chunks = micro_chunks(part, cfg.micro_rows) if part else []
            n_tok, n_csd = all_reduce([float(sum(rows[i].n_response for i in part)),
                                       float(sum(csd.tokens(rows[i]) for i in part))])
            n_micro = int(all_reduce([float(len(chunks))], "max")[0])
            if n_tok == 0:
                continue
            for k in range(n_micro):
                if k < len(chunks):
                    chunk_rows = [rows[i] for i in chunks[k]]
                    b = pad_update_rows(chunk_rows, pad_id, engine.device)
                    need = csd.need(chunk_rows, b["mask"])
                    if csd.needs_cache:            # the teacher reuses the student's KV of the history
                        logp, b["kv"] = token_logprobs(engine, b["input_ids"], b["attention_mask"], keep_cache=True,
                                                       need=need)
                    else:
                        logp = token_logprobs(engine, b["input_ids"], b["attention_mask"], need=need)
                    ppo = chunk_policy_loss(logp, b, cfg, stats, first, ref, kl_coef)   # + kl_coef * L_KL
                    loss = ppo * (float(b["mask"].sum()) / n_tok) * world
                    distill, n_here, s = csd.loss(engine, chunk_rows, b, logp)
                    if n_here and n_csd:
                        loss = loss + csd.alpha * distill * (n_here / n_csd) * world
                    for key in LOSS_STATS:
                        loss_stats[key] += s.get(key, 0.0)
                    engine.backward(loss, scale_wrt_gas=False)
                else:   # this rank has fewer chunks: a zero-weight pass keeps the collectives in step
                    dummy = torch.zeros((1, 2), dtype=torch.long, device=engine.device)
                    logp = token_logprobs(engine, dummy, torch.ones_like(dummy))
                    csd.loss(engine, [], {"input_ids": dummy}, logp[:, :0])
                    engine.backward(logp.sum() * 0.0, scale_wrt_gas=False)
            first = False
            ptx_pass(engine, replay, rng, pad_id, stats)        # + ptx_coef * L_SFT where replayed
            stats.optimizer_step(engine)
    out = stats.result()
    a = dict(zip(LOSS_STATS, all_reduce([loss_stats[k] for k in LOSS_STATS])))
    out["csd/tokens"] = a["tokens"]
    if a["tokens"]:
        out.update({"csd/loss": a["loss_sum"] / a["tokens"], "csd/gate_mean": a["gate_sum"] / a["tokens"],
                    "csd/delta_mean": a["delta_sum"] / a["tokens"],
                    "csd/teacher_minus_student": a["teacher_minus_student_sum"] / a["tokens"],
                    "csd/placebo_token_share": a["placebo_tokens"] / a["tokens"]})
    for k in NOTE_KINDS:
        if a[f"placebo_tokens/{k}"]:
            out[f"csd/placebo_tokens/{k}"] = a[f"placebo_tokens/{k}"]
            out[f"csd/placebo_delta_mean/{k}"] = a[f"placebo_delta_sum/{k}"] / a[f"placebo_tokens/{k}"]
    return out


def train_agent_csd(phase: str, params: Any) -> dict[str, Any] | None:
    """Train ``params.agent_csd`` (GRPO + CSD) on this rank; rank 0 returns the summary."""
    from mimesis_lab.models import assert_no_dropout
    from mimesis_lab.rollout.agent_env import collect_episodes, start_user_side
    from mimesis_lab.rollout.backends import colocated_backend

    cfg = getattr(params, phase)
    inputs, extra = agent_inputs(cfg)
    job = start_policy_job(phase, cfg, inputs, job_module="mimesis_lab.jobs.agent_csd", extra=extra)
    rank, world, fingerprint, resume = job.rank, job.world, job.fingerprint, job.resume
    tokenizer, engine, optimizer, pad_id = job.tokenizer, job.engine, job.optimizer, job.pad_id

    server = shim = run = csd = None
    ok = False
    try:
        skipped: dict[str, int] = {}
        by_gym, tasks = load_training_rows(cfg, params.gyms.tasks, skipped, params.gyms.task_options)
        assert_no_dropout(engine.module)   # teacher and student forwards must not differ by dropout noise
        forbidden = [cfg.user.openai.base_url] if cfg.user.kind == "openai" else []
        csd = CSD(cfg, tokenizer, tasks, pad_id, forbidden_urls=forbidden)
        server, shim, user_model = start_user_side(cfg.user, 4 * cfg.prompts_per_step * cfg.rollouts_per_prompt)
        if cfg.csd.coach.kind == "openai":     # coach calls must not pollute the user-reasoning buffer
            check_coach_endpoint(cfg.csd.coach.openai.base_url, [shim.url] + ([server.url] if server else []))
        backend = colocated_backend(cfg.rollout, cfg.init_from, engine.module, tokenizer)
        refresh = (lambda: backend.update_weights(policy_state_dict(engine))) if cfg.rollout.backend == "vllm" \
            else None
        info = {"gym_rows": {g: len(v) for g, v in by_gym.items()}, "skipped_rows": skipped, "user": cfg.user.kind,
                "invalid_policy": cfg.invalid_policy, "zero_credit": cfg.zero_credit, "csd_alpha": cfg.csd.alpha,
                "csd_beta": cfg.csd.beta, "coach": cfg.csd.coach.kind, "coach_style": cfg.csd.coach.style,
                "placebo": cfg.csd.placebo, **job.info()}

        run = StepRun(phase, cfg, engine, tokenizer, fingerprint, rank, world, show=SHOW, t_start=job.t_start)
        step = run.start(resume, info)
        while step < cfg.steps:
            t0 = time.perf_counter()
            lr = set_lr(optimizer, lr_at(step, cfg.steps, cfg.lr, cfg.warmup_ratio, cfg.min_lr_ratio))
            # 1. trajectories, exactly as in GRPO
            batch = collect_episodes(cfg, step, rank, world, by_gym, tasks, shim, user_model, backend, tokenizer,
                                     before_rollout=refresh, user_server=server)
            rows, bstats = build_agent_rows(batch.trajs, cfg.gamma, cfg.adv_eps, cfg.zero_credit, cfg.invalid_policy)
            # 2. the post-pass: coach the selected turns, build teacher rows
            t_post = time.perf_counter()
            csd.prepare(batch.trajs, {r.rollout_id for r in rows}, batch.privileged, batch.replies,
                        random.Random(f"{cfg.seed}:{step}:{rank}:csd"))
            t_post = time.perf_counter() - t_post
            # 3. L = L_PPO + alpha * L_CSD
            upd = csd_update(engine, rows, csd, cfg, random.Random(f"{cfg.seed}:{step}:update"), pad_id, world,
                             ref=job.ref, replay=job.replay)
            counts = gather(csd.metrics())
            coach_counts = gather(csd.coach.failure_counts(reset=True))
            all_trajs = [t for part in gather(batch.trajs) for t in part]
            all_priv = {k: v for part in gather(batch.privileged) for k, v in part.items()}
            bsum = {k: sum(s[k] for s in gather(bstats)) for k in bstats}
            metrics, records = None, []
            if rank == 0:
                metrics = step_metrics(all_trajs, all_priv, bsum, upd, lr, batch.rollout_time_s, batch.user_stats)
                summed = {k: sum(c[k] for c in counts) for k in counts[0]}
                summed["csd/coached_turn_share"] = summed["csd/rows"] / summed["csd/turns"] \
                    if summed["csd/turns"] else 0.0
                metrics.update(summed)
                metrics["csd/post_pass_time_s"] = t_post
                for part in coach_counts:          # the coach's outcomes by reason, summed over ranks
                    for k, v in part.items():
                        metrics[f"coach/{k}"] = metrics.get(f"coach/{k}", 0.0) + float(v)
                records = [{**t.to_json(), "privileged": all_priv.get(t.traj_id, [])} for t in all_trajs]
            step += 1
            run.end_step(step, metrics, records, t0)
        history = run.history
        summary = run.finish(rollout_summary(history, SUMMARY_KEYS, keep_missing=False))
        ok = True
        return summary
    finally:
        if run is not None:
            run.close(ok)
        for part in (shim, server):
            if part is not None:
                part.stop()
        if csd is not None:
            csd.close()


def main(argv: list[str] | None = None) -> int:
    return job_main(train_agent_csd, ("agent_csd",), prog="python -m mimesis_lab.jobs.agent_csd",
                    description="Agent multi-turn GRPO + CSD", argv=argv)


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main())
