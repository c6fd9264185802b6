"""The ``sim_rl`` job: joint multi-domain simulator RL with FoldGRPO on DeepSpeed (SPEC §2.3–2.4, §6).

Runs on every rank (``python -m mimesis_lab.train.run --phase sim_rl``, started by
``deepspeed``/``torchrun`` through :mod:`mimesis_lab.train.launch`). One step:

1. **Sample** ``prompts_per_step`` task rows jointly: task ``d ~ p(d)`` (the ``weight`` of
   ``sim_rl.tasks``), then a row of ``d`` uniformly (:func:`sample_groups`; a pure function
   of ``(seed, step)``, so a resumed run samples the same tasks). Rank ``k`` takes groups
   ``k, k+W, …`` (data parallel over whole groups: FoldGRPO needs a whole group).
2. **Roll out** ``rollouts_per_prompt`` episodes per row with the *current* policy
   (colocated: the transformers backend reads the DeepSpeed module's weights in place; the
   vLLM backend is refreshed with them before the step) — :func:`run_episodes`, one batched
   generation call per round over every unfinished episode.
3. **Judge** (:func:`score_rollouts`) and account: invalid rollouts are counted per reason;
   format failures give update reward 0 while the raw score is logged.
4. **FoldGRPO** advantages per segment and the **PPO clip** update: ``ppo_epochs`` passes,
   ``minibatches`` optimizer steps per pass, each the token mean of
   :func:`mimesis_lab.rl.losses.ppo_clip_loss` over the minibatch's generated tokens on all
   ranks (micro-chunks of ``micro_rows`` rows, gradient accumulation owned by the caller:
   the DeepSpeed JSON sets ``managed_gradient_accumulation: false``). ``old_logp`` = the
   rollout policy's log-probs recorded at generation. No KL term (as the paper).
5. **Log** per-step metrics (:func:`mimesis_lab.rl.sim_batch.step_metrics` + update stats)
   to ``metrics.jsonl`` and the MLflow run in ``MLFLOW_RUN_ID``; every episode goes to
   ``rollouts.jsonl`` (public and private logs, score, validity).

Checkpoints and ``resume: auto`` work as for the SFT jobs (same markers and fingerprint rule);
the final weights are exported to ``output_dir/final`` (``zero_to_fp32``).
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Sequence

from mimesis_lab.rl.job import (Job, gather, make_rollout_backend, policy_state_dict, ppo_update, run_rl_job,
                                window_means)
from mimesis_lab.rl.sim_batch import AccountingError, build_update_rows, step_metrics
from mimesis_lab.train.loop import TrainConfigError, _file_identity, _init_identity, code_identity

__all__ = ["sample_groups", "sim_rl_fingerprint", "policy_state_dict", "run_sim_rl", "OPERATIONAL_KEYS"]

SUMMARY_KEYS = ("reward/raw_mean", "reward/update_mean", "format_failure_rate", "invalid_rate", "judge/exhibit",
                "announced_rate", "neutral_cooperativeness")

# `steps` is operational: raising it continues a finished run (the lr schedule is constant by default)
OPERATIONAL_KEYS = ("resume", "save_every", "keep_last", "log_every", "launcher", "output_dir", "save_rollouts",
                    "steps")


def sample_groups(task_rows: dict[str, Sequence[dict[str, Any]]], weights: dict[str, float], n: int,
                  rng: random.Random) -> list[dict[str, Any]]:
    """``n`` rows drawn jointly: ``d ~ p(d) = w_d / sum(w)`` over tasks with rows, then a row of ``d`` uniformly."""
    names = [d for d in sorted(weights) if weights[d] > 0 and task_rows.get(d)]
    if not names:
        raise TrainConfigError("sim_rl: no task with a positive weight has any rows")
    w = [float(weights[d]) for d in names]
    out = []
    for _ in range(n):
        d = rng.choices(names, weights=w, k=1)[0]
        out.append(task_rows[d][rng.randrange(len(task_rows[d]))])
    return out


def sim_rl_fingerprint(cfg: Any, ds_config: dict[str, Any]) -> str:
    """sha256 of what determines the trained weights (see :func:`mimesis_lab.train.loop.run_fingerprint`)."""
    import hashlib

    section = {k: v for k, v in cfg.model_dump().items() if k not in OPERATIONAL_KEYS}
    files = {name: _file_identity(t.data) for name, t in cfg.tasks.items()}
    doc = {"phase": "sim_rl", "section": section, "ds_config": ds_config, "init_from": _init_identity(cfg.init_from),
           "task_files": files, "kb": _file_identity(cfg.kb), "guidelines": _file_identity(cfg.guidelines),
           "code": code_identity()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _setup(job: Job) -> dict[str, Any]:
    import mimesis_lab.envs.behavior_task  # noqa: F401  (registers usersim_behavior)
    import mimesis_lab.envs.usersim_tasks  # noqa: F401  (registers the ThoughtTrace tasks)
    from mimesis_lab.abcd import load_guidelines, load_kb
    from mimesis_lab.envs.base import TaskContext
    from mimesis_lab.envs.registry import load_task_rows
    from mimesis_lab.judges.behavior_judge import make_judge

    cfg = job.cfg
    task_rows: dict[str, list[dict[str, Any]]] = {}
    skipped: dict[str, int] = {}
    for ds, t in cfg.tasks.items():
        task_rows[ds], skipped[ds] = load_task_rows(ds, t.data, t.max_rows)
    job.state.update(
        task_rows=task_rows,
        ctx=TaskContext(kb=load_kb(Path(cfg.kb)), guidelines=load_guidelines(Path(cfg.guidelines)),
                        options={ds: {k: v for k, v in t.model_dump().items() if v is not None}
                                 for ds, t in cfg.tasks.items()}),
        judge=make_judge(cfg.judge.kind, cfg.judge.openai),
        weights={ds: t.weight for ds, t in cfg.tasks.items()},
        backend=make_rollout_backend(cfg, job.engine, job.tokenizer),
        show=("reward/raw_mean", "reward/update_mean", "format_failure_rate", "invalid_total", "update/ppo_loss"))
    return {"judge": cfg.judge.kind, "invalid_policy": cfg.invalid_policy,
            "task_rows": {d: len(r) for d, r in task_rows.items()}, "task_rows_skipped": skipped}


def _step(job: Job, step: int) -> tuple[dict[str, float] | None, list[dict[str, Any]]]:
    from mimesis_lab.envs.base import make_episode
    from mimesis_lab.rollout.backends import SamplingParams
    from mimesis_lab.rollout.sim_rollout import run_episodes, score_rollouts

    cfg, st, rank, world = job.cfg, job.state, job.rank, job.world
    t0 = time.perf_counter()
    rng = random.Random(f"{cfg.seed}:{step}")
    lr = job.set_lr(step)
    groups = sample_groups(st["task_rows"], st["weights"], cfg.prompts_per_step, rng)
    episodes, ids = [], []
    for gi in range(rank, len(groups), world):
        gid = f"s{step}g{gi}"
        for k in range(cfg.rollouts_per_prompt):
            episodes.append(make_episode(groups[gi], st["ctx"], random.Random(f"{cfg.seed}:{gid}:{k}")))
            ids.append((gid, f"{gid}r{k}"))
    if cfg.rollout.backend == "vllm":
        st["backend"].update_weights(policy_state_dict(job.engine))
    sampling = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                              top_p=cfg.rollout.top_p, seed=(cfg.seed * 1_000_003 + step * 9973 + rank))
    rollouts = run_episodes(episodes, ids, st["backend"], job.tokenizer, sampling, require_think=cfg.require_think,
                            max_prompt_tokens=cfg.rollout.max_prompt_tokens)
    t_roll = time.perf_counter() - t0
    score_rollouts(rollouts, episodes, st["judge"])
    rows, bstats = build_update_rows(rollouts, cfg.invalid_policy, cfg.adv_eps)
    upd = ppo_update(job.engine, rows, cfg, random.Random(f"{cfg.seed}:{step}:update"), job.pad_id, world)
    all_rollouts = [r for part in gather(rollouts) for r in part]
    bsum = {k: sum(s[k] for s in gather(bstats)) for k in bstats if k != "adv_abs_mean"}
    if rank != 0:
        return None, []
    m = step_metrics(all_rollouts)
    if m["rollouts"] != cfg.prompts_per_step * cfg.rollouts_per_prompt:
        raise AccountingError(f"step {step + 1}: {m['rollouts']} rollouts, expected "
                              f"{cfg.prompts_per_step * cfg.rollouts_per_prompt}")
    m.update({f"batch/{k}": v for k, v in bsum.items()})
    m.update(upd)
    m.update({"lr": lr, "rollout_time_s": t_roll, "episodes_per_s": len(all_rollouts) / max(t_roll, 1e-9)})
    return m, [r.to_json() for r in all_rollouts]


def _summary(history: list[dict[str, float]]) -> dict[str, Any]:
    out = window_means(history, SUMMARY_KEYS)
    out["invalid_rollouts_total"] = sum(r.get("invalid_total", 0.0) for r in history)
    out["rollouts_total"] = sum(r.get("rollouts", 0.0) for r in history)
    return out


def run_sim_rl(params: Any) -> dict[str, Any] | None:
    """Train ``params.sim_rl`` on this rank; rank 0 returns the summary (also ``final/training_summary.json``)."""
    cfg = params.sim_rl
    if cfg is None:
        raise TrainConfigError("params has no `sim_rl` section")
    return run_rl_job("sim_rl", cfg, lambda ds: sim_rl_fingerprint(cfg, ds), _setup, _step, _summary)
