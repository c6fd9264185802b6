"""Does a simulator checkpoint enact the behaviour its prompt instructs? The sim_rl behaviour task, measured.

Rolls out ``--k`` episodes of every *instructed* (non-neutral) behaviour-task row with the checkpoint as
the customer and the scripted ABCD agent as the partner (the sim_rl episode, turn budget and sampling
settings of ``params.yaml``), judges them with ``sim_rl.judge`` (offline: the rule judge) and prints

- the judged exhibit of the instructed behaviour (mean, share >= 0.5, per behaviour);
- the share of groups (the ``k`` rollouts of one row) whose exhibit differs -- the groups that give
  simulator RL a behaviour advantage to learn from;
- the share of rollouts with a format failure (any turn), and the failures by kind.

``--compare OTHER`` probes a second checkpoint on the same rows and seeds and adds the paired difference of
the per-row mean exhibit (this checkpoint − OTHER) with a 95% bootstrap CI over rows.

    python scripts/behavior_probe.py models/sft/final [--k 4] [--top-p 0.7] [--temperature 0.8] [--json out.json]
    python scripts/behavior_probe.py models/sim_rl/final --compare models/sft/final --k 8

Used to choose the world's ThoughtTrace mix (params.yaml ``world.thoughttrace_mix``); it is a diagnostic,
not a test.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def probe(checkpoint: str, params_path: str = "params.yaml", *, k: int = 4, top_p: float | None = None,
          temperature: float | None = None, seed: int = 7) -> dict[str, Any]:
    import mimesis_lab.envs.behavior_task  # noqa: F401  (registers usersim_behavior)
    from mimesis_lab.config import load_params
    from mimesis_lab.envs.base import make_episode
    from mimesis_lab.envs.registry import load_task_rows
    from mimesis_lab.jobs.sim_rl import task_context
    from mimesis_lab.judges.behavior_judge import make_judge
    from mimesis_lab.models import load_model
    from mimesis_lab.rollout.backends import SamplingParams, TransformersBackend
    from mimesis_lab.rollout.sim_rollout import run_episodes, score_rollouts
    from mimesis_lab.tokenizer import load_tokenizer

    cfg = load_params(params_path).sim_rl
    task = cfg.tasks["usersim_behavior"]
    rows, _ = load_task_rows("usersim_behavior", task.data, None)
    rows = [r for r in rows if json.loads(r.get("behavior_ids") or "[]")]
    if not rows:
        raise SystemExit(f"{task.data}: no instructed (non-neutral) behaviour-task rows")
    ctx = task_context(cfg)
    judge = make_judge(cfg.judge.kind, cfg.judge.openai)
    model, tok = load_model(checkpoint).eval(), load_tokenizer(checkpoint)
    backend = TransformersBackend(model, tok, batch_size=cfg.rollout.batch_size)
    episodes, ids = [], []
    for i, r in enumerate(rows):
        for j in range(k):
            episodes.append(make_episode(r, ctx, random.Random(f"{seed}:{i}:{j}")))
            ids.append((f"g{i}", f"g{i}r{j}"))
    sampling = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens,
                              temperature=cfg.rollout.temperature if temperature is None else temperature,
                              top_p=cfg.rollout.top_p if top_p is None else top_p, seed=seed)
    t0 = time.perf_counter()
    rollouts = run_episodes(episodes, ids, backend, tok, sampling, require_think=cfg.require_think,
                            max_prompt_tokens=cfg.rollout.max_prompt_tokens)
    score_rollouts(rollouts, episodes, judge)
    by: dict[str, list[float]] = defaultdict(list)
    per_row: dict[str, list[float]] = defaultdict(list)      # a row's k rollouts are one group
    for r, ep in zip(rollouts, episodes):
        ex = r.score.components.get("exhibit") if r.invalid is None and r.score is not None else None
        if ex is not None:
            by[ep.behavior].append(float(ex))
            per_row[ep.task_id].append(float(ex))
    allx = [x for v in by.values() for x in v]
    return {
        "checkpoint": checkpoint, "rows": len(rows), "rollouts": len(rollouts), "k": k,
        "top_p": sampling.top_p, "temperature": sampling.temperature,
        "judged": len(allx), "exhibit_mean": sum(allx) / max(1, len(allx)),
        "exhibited_share": sum(x >= 0.5 for x in allx) / max(1, len(allx)),
        "groups_with_exhibit_variance": sum(len(set(g)) > 1 for g in per_row.values()) / max(1, len(per_row)),
        "format_failure_rollouts": sum(r.format_failures > 0 for r in rollouts) / len(rollouts),
        "format_errors": dict(Counter(s.format_error for r in rollouts for s in r.segments if not s.format_ok)),
        "invalid": dict(Counter(r.invalid for r in rollouts if r.invalid)),
        "exhibit_by_behavior": {b: round(sum(v) / len(v), 3) for b, v in sorted(by.items())},
        "exhibit_by_row": {row: sum(v) / len(v) for row, v in per_row.items()},
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--k", type=int, default=4, help="rollouts per row (default 4)")
    ap.add_argument("--top-p", type=float, default=None, help="default: sim_rl.rollout.top_p")
    ap.add_argument("--temperature", type=float, default=None, help="default: sim_rl.rollout.temperature")
    ap.add_argument("--compare", default=None, help="a second checkpoint: paired per-row exhibit difference")
    ap.add_argument("--json", default=None, help="also write the result here")
    a = ap.parse_args(argv)
    out = probe(a.checkpoint, a.params, k=a.k, top_p=a.top_p, temperature=a.temperature)
    if a.compare:
        from mimesis_lab.evals.effects import bootstrap_ci
        other = probe(a.compare, a.params, k=a.k, top_p=a.top_p, temperature=a.temperature)
        rows = sorted(set(out["exhibit_by_row"]) & set(other["exhibit_by_row"]))
        diffs = [out["exhibit_by_row"][r] - other["exhibit_by_row"][r] for r in rows]
        out["compare"] = {"checkpoint": a.compare, "rows": len(rows),
                          "exhibit_diff": sum(diffs) / len(diffs) if diffs else None,
                          "ci": bootstrap_ci(diffs), "ci_unit": "row",
                          **{f"other_{k}": other[k] for k in ("exhibit_mean", "exhibited_share",
                                                               "format_failure_rollouts")}}
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
