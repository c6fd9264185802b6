"""Simulator RL — joint multi-domain FoldGRPO with the behaviour reward (SPEC §2.3–2.4, §6).

Launch (one process per rank; the training flow does this for ``dvc repro``)::

    deepspeed --num_gpus 1 --module mimesis_lab.jobs.sim_rl --params params.yaml
    python -m mimesis_lab.jobs.sim_rl                               # world size 1, no launcher

One step, top to bottom in :func:`train_sim_rl`:

1. **Sample** ``prompts_per_step`` task rows jointly: task ``d ~ p(d)`` (the ``weight`` of
   ``sim_rl.tasks``), then a row of ``d``: uniformly (``row_order: uniform``, :func:`sample_groups`) or the next
   of a pass over ``d``'s rows that spreads the behaviours evenly (``stratified``, :func:`stratified_order`);
   :class:`TaskSampler`, a pure function of ``(seed, step)``, so a resumed run samples the same tasks. Rank
   ``k`` takes groups ``k, k+W, …`` (data parallel over whole groups: FoldGRPO needs a whole group).
2. **Roll out** ``rollouts_per_prompt`` episodes per row with the *current* policy (colocated: the
   transformers backend reads the DeepSpeed module's weights in place; a vLLM engine is refreshed
   with them before the step), one batched generation call per round over every unfinished episode.
3. **Judge** and account: invalid rollouts are counted per reason; format failures give update
   reward 0 while the raw score is logged.
4. **FoldGRPO** advantages per segment (:func:`~mimesis_lab.rl.sim_batch.build_update_rows`; with
   ``encode: trajectory`` a rollout's segments are one prefix-tree row, each shared history token
   encoded once) and the **PPO-clip** update (:func:`~mimesis_lab.rl.ppo.ppo_update`). ``old_logp`` =
   the rollout's log-probs. No KL term (as the paper).
5. **Log** per-step metrics to ``metrics.jsonl`` and MLflow, every episode to ``rollouts.jsonl``.
"""
from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any, Sequence

from mimesis_lab.rl.policy import policy_state_dict
from mimesis_lab.rl.ppo import ppo_update, rollout_summary, start_policy_job
from mimesis_lab.rl.sim_batch import AccountingError, build_update_rows, step_metrics
from mimesis_lab.train.runtime import TrainConfigError, gather, job_main, set_lr
from mimesis_lab.train.schedule import lr_at
from mimesis_lab.train.step_run import StepRun

__all__ = ["weighted_tasks", "sample_groups", "stratified_order", "TaskSampler", "train_sim_rl", "main"]

SUMMARY_KEYS = ("reward/raw_mean", "reward/update_mean", "format_failure_rate", "invalid_rate", "judge/exhibit",
                "announced_rate", "neutral_cooperativeness")
SHOW = ("reward/raw_mean", "reward/update_mean", "format_failure_rate", "invalid_total", "update/ppo_loss")


def weighted_tasks(task_rows: dict[str, Sequence[dict[str, Any]]],
                   weights: dict[str, float]) -> tuple[list[str], list[float]]:
    """The tasks ``d`` of ``p(d) = w_d / sum(w)`` (sorted: those with a positive weight and rows) and their
    weights; no such task is a :class:`TrainConfigError`."""
    names = [d for d in sorted(weights) if weights[d] > 0 and task_rows.get(d)]
    if not names:
        raise TrainConfigError("sim_rl: no task with a positive weight has any rows")
    return names, [float(weights[d]) for d in names]


def sample_groups(task_rows: dict[str, Sequence[dict[str, Any]]], weights: dict[str, float], n: int,
                  rng: random.Random) -> list[dict[str, Any]]:
    """``n`` rows drawn jointly: ``d ~ p(d) = w_d / sum(w)`` over tasks with rows, then a row of ``d`` uniformly."""
    names, w = weighted_tasks(task_rows, weights)
    out = []
    for _ in range(n):
        d = rng.choices(names, weights=w, k=1)[0]
        out.append(task_rows[d][rng.randrange(len(task_rows[d]))])
    return out


def row_stratum(row: dict[str, Any]) -> str:
    """The stratum of a task row for ``row_order: stratified``: a behaviour-task row's ``behavior_ids`` as
    written (``["B2"]``; ``[]`` for the neutral control), ``""`` for rows without (one stratum)."""
    return str(row.get("behavior_ids") or "")


def stratified_order(rows: Sequence[dict[str, Any]], seed: str) -> list[int]:
    """One pass over ``rows`` (a permutation of their indices) in which every stratum (:func:`row_stratum`) is
    spread evenly: each stratum's rows are shuffled, then dealt by smooth weighted round robin — every position
    adds ``m / n`` to each stratum's credit (``m`` of its rows out of ``n``; the credits start at ``U[0, 1)``)
    and the stratum with the most credit (ties in a seeded random order) gives its next row and loses 1. Every
    prefix then holds each stratum in proportion up to about one row, so any run of consecutive draws does up
    to about two, where uniform draws with replacement leave the share to chance (the behaviour task: 26 neutral
    rows of 82, a 13-step window of about 40 draws holds 13 ± 3 of them). Every row is drawn once per pass, so
    each row is drawn as often as under uniform draws. A pure function of ``seed``."""
    rng = random.Random(seed)
    by: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by.setdefault(row_stratum(r), []).append(i)
    labels = sorted(by)
    for lab in labels:
        rng.shuffle(by[lab])
    rng.shuffle(labels)                         # the tie order
    if len(labels) <= 1:                        # one stratum: a plain shuffle
        return by[labels[0]] if labels else []
    n = len(rows)
    credit = {lab: rng.random() for lab in labels}
    taken = dict.fromkeys(labels, 0)
    out: list[int] = []
    for _ in range(n):
        for lab in labels:
            credit[lab] += len(by[lab]) / n
        lab = max((x for x in labels if taken[x] < len(by[x])), key=lambda x: credit[x])
        credit[lab] -= 1.0
        out.append(by[lab][taken[lab]])
        taken[lab] += 1
    return out


class TaskSampler:
    """The step's groups under ``row_order`` (``sim_rl.row_order``). ``uniform``: :func:`sample_groups` with
    ``random.Random(f"{seed}:{step}")``, as the reference. ``stratified``: the task ``d ~ p(d)`` drawn the same
    way, the row the next one of ``d``'s current pass (:func:`stratified_order`, a new pass per epoch seeded by
    ``(seed, d, epoch)``). Both are pure functions of ``(seed, step)``: a resumed run samples the same rows
    (the stratified sampler replays the task draws of the earlier steps to find each task's position)."""

    def __init__(self, task_rows: dict[str, Sequence[dict[str, Any]]], weights: dict[str, float], n: int,
                 seed: int, row_order: str = "uniform"):
        if row_order not in ("uniform", "stratified"):
            raise TrainConfigError(f"sim_rl.row_order: {row_order!r} is neither uniform nor stratified")
        self.task_rows, self.weights, self.n, self.seed, self.row_order = task_rows, weights, n, seed, row_order
        self.names, self._w = weighted_tasks(task_rows, weights)
        self._next_step, self._drawn = 0, {d: 0 for d in self.names}
        self._passes: dict[tuple[str, int], list[int]] = {}

    def _tasks(self, step: int) -> list[str]:
        rng = random.Random(f"{self.seed}:{step}")           # d ~ p(d) per group; the rows come from the passes
        return [rng.choices(self.names, weights=self._w, k=1)[0] for _ in range(self.n)]

    def _row(self, d: str) -> dict[str, Any]:
        rows, c = self.task_rows[d], self._drawn[d]
        epoch, k = divmod(c, len(rows))
        if (d, epoch) not in self._passes:
            self._passes = {key: v for key, v in self._passes.items() if key[0] != d}
            self._passes[(d, epoch)] = stratified_order(rows, f"{self.seed}:{d}:epoch{epoch}")
        self._drawn[d] = c + 1
        return rows[self._passes[(d, epoch)][k]]

    def groups(self, step: int) -> list[dict[str, Any]]:
        """The ``n`` task rows of ``step``."""
        if self.row_order == "uniform":
            return sample_groups(self.task_rows, self.weights, self.n, random.Random(f"{self.seed}:{step}"))
        if step < self._next_step:                       # asked again for an earlier step: replay from 0
            self._next_step, self._drawn = 0, {d: 0 for d in self.names}
        while self._next_step < step:                    # the earlier steps' draws move each task's position
            for d in self._tasks(self._next_step):
                self._drawn[d] += 1
            self._next_step += 1
        out = [self._row(d) for d in self._tasks(step)]
        self._next_step = step + 1
        return out


def task_context(cfg: Any) -> Any:
    """The :class:`~mimesis_lab.envs.base.TaskContext` of ``cfg`` (a ``sim_rl`` section): the ABCD kb and
    guidelines, and each task's options (its params, unset ones left out)."""
    from mimesis_lab.abcd import load_guidelines, load_kb
    from mimesis_lab.envs.base import TaskContext

    return TaskContext(kb=load_kb(Path(cfg.kb)), guidelines=load_guidelines(Path(cfg.guidelines)),
                       options={ds: {k: v for k, v in t.model_dump().items() if v is not None}
                                for ds, t in cfg.tasks.items()})


def train_sim_rl(phase: str, params: Any) -> dict[str, Any] | None:
    """Train ``params.sim_rl`` on this rank; rank 0 returns the summary (also ``final/training_summary.json``)."""
    import mimesis_lab.envs.behavior_task  # noqa: F401  (registers usersim_behavior)
    import mimesis_lab.envs.usersim_tasks  # noqa: F401  (registers the ThoughtTrace tasks)
    from mimesis_lab.envs.base import make_episode
    from mimesis_lab.envs.behavior_task import DATA_SOURCE, unreachable_rows
    from mimesis_lab.envs.registry import load_task_rows
    from mimesis_lab.judges.behavior_judge import make_judge
    from mimesis_lab.rollout.backends import SamplingParams, colocated_backend
    from mimesis_lab.rollout.sim_rollout import run_episodes, score_rollouts

    cfg = params.sim_rl
    inputs = {"init_from": cfg.init_from, "kb": cfg.kb, "guidelines": cfg.guidelines,
              **{f"task:{name}": t.data for name, t in cfg.tasks.items()}}
    job = start_policy_job(phase, cfg, inputs, job_module="mimesis_lab.jobs.sim_rl")
    rank, world, fingerprint, resume = job.rank, job.world, job.fingerprint, job.resume
    tokenizer, engine, optimizer, pad_id = job.tokenizer, job.engine, job.optimizer, job.pad_id

    # -- tasks, judge, rollout engine ----------------------------------------------------------------
    task_rows: dict[str, list[dict[str, Any]]] = {}
    skipped: dict[str, int] = {}
    for ds, t in cfg.tasks.items():
        task_rows[ds], skipped[ds] = load_task_rows(ds, t.data, t.max_rows)
    ctx = task_context(cfg)
    judge = make_judge(cfg.judge.kind, cfg.judge.openai)
    weights = {ds: t.weight for ds, t in cfg.tasks.items()}
    backend = colocated_backend(cfg.rollout, cfg.init_from, engine.module, tokenizer)
    late = unreachable_rows(task_rows.get(DATA_SOURCE, []), ctx.option(DATA_SOURCE, "turn_budget"))
    if late and rank == 0:
        print(f"[sim_rl] warning: {len(late)} of {len(task_rows[DATA_SOURCE])} {DATA_SOURCE} rows time their behaviour "
              f"past the episode's last turn (e.g. {', '.join(late[:3])}): they cannot be enacted; build the tasks "
              "for the episode's budget (behavior_tasks.turn_budget)", flush=True)
    info = {"judge": cfg.judge.kind, "invalid_policy": cfg.invalid_policy,
            "task_rows": {d: len(r) for d, r in task_rows.items()}, "task_rows_skipped": skipped,
            "behavior_rows_unreachable": len(late), **job.info()}

    sampler = TaskSampler(task_rows, weights, cfg.prompts_per_step, cfg.seed, cfg.row_order)
    run = StepRun(phase, cfg, engine, tokenizer, fingerprint, rank, world, show=SHOW, t_start=job.t_start)
    ok = False
    try:
        step = run.start(resume, info)
        while step < cfg.steps:
            t0 = time.perf_counter()
            lr = set_lr(optimizer, lr_at(step, cfg.steps, cfg.lr, cfg.warmup_ratio, cfg.min_lr_ratio))
            # 1. sample the step's groups; this rank's share
            groups = sampler.groups(step)
            episodes, ids = [], []
            for gi in range(rank, len(groups), world):
                gid = f"s{step}g{gi}"
                for k in range(cfg.rollouts_per_prompt):
                    episodes.append(make_episode(groups[gi], ctx, random.Random(f"{cfg.seed}:{gid}:{k}")))
                    ids.append((gid, f"{gid}r{k}"))
            # 2. roll out with the current policy
            if cfg.rollout.backend == "vllm":
                backend.update_weights(policy_state_dict(engine))
            sampling = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                                      top_p=cfg.rollout.top_p, seed=(cfg.seed * 1_000_003 + step * 9973 + rank))
            rollouts = run_episodes(episodes, ids, backend, tokenizer, sampling, require_think=cfg.require_think,
                                    max_prompt_tokens=cfg.rollout.max_prompt_tokens)
            t_roll = time.perf_counter() - t0
            # 3. judge; 4. FoldGRPO rows and the PPO-clip update
            judged = score_rollouts(rollouts, episodes, judge)      # judge/* counts: failures by reason, retries
            rows, bstats = build_update_rows(rollouts, cfg.invalid_policy, cfg.adv_eps, cfg.encode)
            upd = ppo_update(engine, rows, cfg, random.Random(f"{cfg.seed}:{step}:update"), pad_id, world,
                             ref=job.ref, replay=job.replay)
            # 5. metrics (rank 0 sees every rank's rollouts)
            all_rollouts = [r for part in gather(rollouts) for r in part]
            bsum = {k: sum(s[k] for s in gather(bstats)) for k in bstats if k != "adv_abs_mean"}
            judged_all = gather(judged)
            metrics, records = None, []
            if rank == 0:
                metrics = step_metrics(all_rollouts)
                if metrics["rollouts"] != cfg.prompts_per_step * cfg.rollouts_per_prompt:
                    raise AccountingError(f"step {step + 1}: {metrics['rollouts']} rollouts, expected "
                                          f"{cfg.prompts_per_step * cfg.rollouts_per_prompt}")
                metrics.update({f"batch/{k}": v for k, v in bsum.items()})
                for part in judged_all:            # summed over ranks (counts)
                    for k, v in part.items():
                        metrics[k] = metrics.get(k, 0.0) + float(v)
                metrics.update(upd)
                metrics.update({"lr": lr, "rollout_time_s": t_roll,
                                "episodes_per_s": len(all_rollouts) / max(t_roll, 1e-9)})
                records = [r.to_json() for r in all_rollouts]
            step += 1
            run.end_step(step, metrics, records, t0)
        history = run.history
        summary = run.finish(rollout_summary(history, SUMMARY_KEYS))
        ok = True
        return summary
    finally:
        run.close(ok)
        judge_close = getattr(judge, "close", None)
        if judge_close is not None:
            judge_close()


def main(argv: list[str] | None = None) -> int:
    return job_main(train_sim_rl, ("sim_rl",), prog="python -m mimesis_lab.jobs.sim_rl",
                    description="Simulator RL (FoldGRPO)", argv=argv)


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main())
