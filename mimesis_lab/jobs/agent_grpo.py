"""Agent multi-turn GRPO in the gyms against the frozen simulator (SPEC §3.1–3.2).

Launch (one process per rank; the training flow does this for ``dvc repro``)::

    deepspeed --num_gpus 1 --module mimesis_lab.jobs.agent_grpo --params params.yaml
    python -m mimesis_lab.jobs.agent_grpo                           # world size 1, no launcher

One step, top to bottom in :func:`train_agent_grpo`:

1. :func:`~mimesis_lab.rollout.agent_env.collect_episodes` samples ``prompts_per_step`` rows of the
   ``gyms`` stage (gym by weight, then a row; rank ``k`` takes groups ``k, k+W, …``) and plays
   ``rollouts_per_prompt`` trajectories each. The **user side** is the frozen simulator behind the
   **privileged shim** (served in-process for ``user.kind: simulator``, an external server for
   ``openai``); every episode talks to ``{shim}/ep/{episode}/v1``, so the agent only ever sees
   public utterances. A privacy guard stops the job if any simulator reasoning reached an agent input.
2. :func:`~mimesis_lab.rl.agent_batch.build_agent_rows`: R2G turn credit, the group-normalised
   trajectory score, credits rescaled to ``A_i`` on the agent's own tokens.
3. The PPO-clip update (:func:`~mimesis_lab.rl.ppo.ppo_update`); then the step's metrics (reward
   overall and per gym, invalid counts by reason, tool-call errors, turns, PPO statistics).

The CSD sibling (``mimesis_lab.jobs.agent_csd``) is this recipe plus the coached distillation term.
"""
from __future__ import annotations

import random
import time
from typing import Any

from mimesis_lab.rl.agent_batch import agent_step_metrics, build_agent_rows
from mimesis_lab.rl.policy import policy_state_dict
from mimesis_lab.rl.ppo import ppo_update, rollout_summary, start_policy_job
from mimesis_lab.train.runtime import TrainConfigError, gather, job_main, set_lr
from mimesis_lab.train.schedule import lr_at
from mimesis_lab.train.step_run import StepRun

__all__ = ["SUMMARY_KEYS", "agent_inputs", "load_training_rows", "step_metrics", "train_agent_grpo", "main"]

SUMMARY_KEYS = ("reward/mean", "invalid_rate", "tool_call_error_rate", "turns_mean")
SHOW = ("reward/mean", "invalid_total", "tool_call_error_rate", "update/ppo_loss")


def agent_inputs(cfg: Any) -> tuple[dict[str, str | None], dict[str, Any]]:
    """The fingerprint's inputs and extras of an agent section: the initial agent, the gym rows and the
    user (its checkpoint, or the external endpoint's settings)."""
    inputs = {"init_from": cfg.init_from, "data": cfg.data,
              "user": cfg.user.model_path if cfg.user.kind == "simulator" else None}
    extra = {"user_endpoint": cfg.user.openai.model_dump() if cfg.user.kind == "openai" else None}
    return inputs, extra


def load_training_rows(cfg: Any, task_files: dict[str, str | None], skipped_out: dict[str, int] | None = None,
                       task_options: Any = None
                       ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """``(rows by gym, tasks by gym)`` of the training gyms with a positive weight; the tasks come from
    ``gyms.tasks`` (``task_files``; None = the bundled file), as the ``gyms`` stage read them. Rows may be
    UserRL's as published (no ``gym``/``task_id``/``split``: derived). ``skipped_out`` (when given) gets
    the rows left out per reason (``unknown_data_source``, ``no_task_id``, ``gym_not_trained``…)."""
    from mimesis_lab.envs.gyms.registry import TaskLookupError, load_tasks_or_unreadable, resolve_task
    from mimesis_lab.rollout.agent_env import load_gym_rows

    from mimesis_lab.io import ParquetReadError

    skipped: dict[str, int] = {}
    try:
        all_rows = load_gym_rows(cfg.data, skipped)
    except ParquetReadError as e:
        raise TrainConfigError(str(e)) from None
    rows = [r for r in all_rows if r["gym"] in cfg.gyms and cfg.gyms[r["gym"]] > 0]
    other = len(all_rows) - len(rows)
    if other:
        skipped["gym_not_trained"] = other
    if not rows:
        raise TrainConfigError(f"{cfg.data}: no rows of the gyms {sorted(cfg.gyms)} (left out: {skipped})")
    opts = task_options or (lambda g: {})      # gyms.task_options: tau's db, search's corpus
    tasks = {g: load_tasks_or_unreadable(g, task_files.get(g), **opts(g)) for g in {r["gym"] for r in rows}}
    by_gym: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        try:
            resolve_task(r, tasks)
        except TaskLookupError as e:          # not in its task file, or the file unreadable: counted, left out
            skipped[e.reason] = skipped.get(e.reason, 0) + 1
            continue
        by_gym.setdefault(r["gym"], []).append(r)
    if not by_gym:
        raise TrainConfigError(f"{cfg.data}: no row of the gyms {sorted(cfg.gyms)} has its task (left out: {skipped})")
    if skipped_out is not None:
        skipped_out.update(skipped)
    return by_gym, {g: tasks[g] for g in by_gym}


def step_metrics(trajs: list[Any], privileged: dict[str, list[str]], bsum: dict[str, float],
                 upd: dict[str, float], lr: float, t_roll: float,
                 user_stats: dict[str, float] | None = None) -> dict[str, float]:
    """Rank 0's metrics of one agent step (all ranks' trajectories; ``user/*``: rank 0's shim counters)."""
    m = agent_step_metrics(trajs)
    m["invalid_rate"] = m["invalid_total"] / max(m["rollouts"], 1.0)
    m.update({f"batch/{k}": v for k, v in bsum.items()})
    m.update(upd)
    m.update({"lr": lr, "rollout_time_s": t_roll, "episodes_per_s": len(trajs) / max(t_roll, 1e-9),
              "privileged_turns": float(sum(len(v) for v in privileged.values())), "privacy_leaks": 0.0})
    m.update({f"user/{k}": v for k, v in (user_stats or {}).items()})
    return m


def train_agent_grpo(phase: str, params: Any) -> dict[str, Any] | None:
    """Train ``params.agent_grpo`` on this rank; rank 0 returns the summary."""
    from mimesis_lab.rollout.agent_env import collect_episodes, start_user_side
    from mimesis_lab.rollout.backends import colocated_backend

    cfg = getattr(params, phase)
    inputs, extra = agent_inputs(cfg)
    job = start_policy_job(phase, cfg, inputs, job_module="mimesis_lab.jobs.agent_grpo", extra=extra)
    rank, world, fingerprint, resume = job.rank, job.world, job.fingerprint, job.resume
    tokenizer, engine, optimizer, pad_id = job.tokenizer, job.engine, job.optimizer, job.pad_id

    server = shim = run = None
    ok = False
    try:
        skipped: dict[str, int] = {}
        by_gym, tasks = load_training_rows(cfg, params.gyms.tasks, skipped, params.gyms.task_options)
        server, shim, user_model = start_user_side(cfg.user, 4 * cfg.prompts_per_step * cfg.rollouts_per_prompt)
        backend = colocated_backend(cfg.rollout, cfg.init_from, engine.module, tokenizer)
        refresh = (lambda: backend.update_weights(policy_state_dict(engine))) if cfg.rollout.backend == "vllm" \
            else None
        info = {"gym_rows": {g: len(v) for g, v in by_gym.items()}, "skipped_rows": skipped, "user": cfg.user.kind,
                "invalid_policy": cfg.invalid_policy, "zero_credit": cfg.zero_credit, **job.info()}

        run = StepRun(phase, cfg, engine, tokenizer, fingerprint, rank, world, show=SHOW, t_start=job.t_start)
        step = run.start(resume, info)
        while step < cfg.steps:
            t0 = time.perf_counter()
            lr = set_lr(optimizer, lr_at(step, cfg.steps, cfg.lr, cfg.warmup_ratio, cfg.min_lr_ratio))
            # 1. trajectories against the user behind the shim (privacy-checked)
            batch = collect_episodes(cfg, step, rank, world, by_gym, tasks, shim, user_model, backend, tokenizer,
                                     before_rollout=refresh, user_server=server)
            # 2. multi-turn GRPO rows; 3. the PPO-clip update
            rows, bstats = build_agent_rows(batch.trajs, cfg.gamma, cfg.adv_eps, cfg.zero_credit, cfg.invalid_policy)
            upd = ppo_update(engine, rows, cfg, random.Random(f"{cfg.seed}:{step}:update"), pad_id, world,
                             ref=job.ref, replay=job.replay)
            all_trajs = [t for part in gather(batch.trajs) for t in part]
            all_priv = {k: v for part in gather(batch.privileged) for k, v in part.items()}
            bsum = {k: sum(s[k] for s in gather(bstats)) for k in bstats}
            metrics, records = None, []
            if rank == 0:
                metrics = step_metrics(all_trajs, all_priv, bsum, upd, lr, batch.rollout_time_s, batch.user_stats)
                records = [{**t.to_json(), "privileged": all_priv.get(t.traj_id, [])} for t in all_trajs]
            step += 1
            run.end_step(step, metrics, records, t0)
        history = run.history
        summary = run.finish(rollout_summary(history, SUMMARY_KEYS, keep_missing=False))   # no csd/* in GRPO
        ok = True
        return summary
    finally:
        if run is not None:
            run.close(ok)
        for part in (shim, server):
            if part is not None:
                part.stop()


def main(argv: list[str] | None = None) -> int:
    return job_main(train_agent_grpo, ("agent_grpo",), prog="python -m mimesis_lab.jobs.agent_grpo",
                    description="Agent multi-turn GRPO", argv=argv)


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main())
