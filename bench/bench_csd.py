"""CSD step-time overhead: ``agent_csd`` (multi-turn GRPO + coached self-distillation) vs plain
``agent_grpo``, same setup, tiny model, CPU.

What it measures: the wall time of one RL step (``step_time_s`` in ``metrics.jsonl``: rollouts,
the CSD post-pass that builds coached/placebo teacher rows, and the PPO update with its no-grad
teacher forwards) of the CSD job against the GRPO job. Both jobs start from the same warm-started
tiny travel agent with the same data, seed and batch shape, so step 1 samples the SAME rollout
batch in both (checked: the step-1 episodes in ``rollouts.jsonl`` are compared); later steps
diverge because the weights do. The baseline is measured in the same run of this script, on the
same machine, alternating GRPO/CSD jobs ``--repeat`` times.

Reported (ratios are CSD / GRPO): step-1 ``step_time_s`` of each and their ratio, mean
``step_time_s`` over all steps and its ratio, the update-only time (``step_time_s -
rollout_time_s``; for CSD that includes the post-pass) and its ratio, and the CSD counts
(``csd/rows``, ``csd/placebo_rows``, ``csd/tokens`` vs ``update/tokens``). The target is a
step-time ratio <= 1.3x; PASS/FAIL is printed against it, but the exit status is 0 either way
(a benchmark, not a test) unless a job fails.

    python bench/bench_csd.py [--out DIR] [--steps 4] [--prompts 4] [--rollouts 4] [--repeat 1]
                              [--placebo | --no-placebo] [--no-ask] [--no-varied-user] [--json results.json]

The setup comes from ``scripts/agent_grpo_signal.py`` (``build``: tiny warm-started travel agent,
travel rows, params; tracking disabled here), with two adjustments so that CSD has work to do:
half of the warm-start oracle traces ask the user once before searching (``build(ask=True)``;
the stock travel oracle never asks, so the agent would never talk to the user and the coach would
have no cue: zero teacher rows), and the scripted user varies its answer (deterministically per conversation) so the
template coach writes different notes and placebo rows can be drawn. ``--no-ask`` and
``--no-varied-user`` restore the stock setup. Each job runs as ``python -m mimesis_lab.jobs.<phase> --phase <phase>``
(a world-size-1 DeepSpeed job on CPU) with ``OMP_NUM_THREADS=1``.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from agent_grpo_signal import USER_REPLY, build, serve_user  # noqa: E402

TARGET = 1.3


#: Scripted user answers with different template-coach cues (unmet budget/location, unmet
#: amenities, ready, negative + question), so the coach writes different notes and the placebo
#: pool has a note from another episode that differs from the current one.
VARIED_REPLIES = (
    USER_REPLY,
    "<think>I need a pool and breakfast; they have not asked about that yet.</think>I would like a pool and breakfast.",
    "<think>That covers everything, I am ready for a recommendation.</think>Sounds good, go ahead.",
    "<think>This is frustrating, they are not listening.</think>No, that is not what I asked. Which options are near "
    "the beach?",
)


def varied_reply(raw: bytes) -> str:
    """The answer picked by a hash of the request body: deterministic per conversation (the same in
    the GRPO and the CSD job)."""
    return VARIED_REPLIES[int(hashlib.sha256(raw).hexdigest(), 16) % len(VARIED_REPLIES)]


TURNS = 1   # coached turns per trajectory (--turns; the params default)
TEACHER_CACHE = True   # --teacher-cache / --no-teacher-cache


def _csd_section(placebo: bool) -> dict:
    return {"alpha": 0.01, "beta": 5.0, "placebo": placebo, "placebo_min_pool": 2, "turns_per_trajectory": TURNS,
            "teacher_cache": TEACHER_CACHE,
            "skip_gyms": [], "leak_check": True, "coach": {"kind": "template", "style": "prospective"}}


def write_params(base: dict, out: Path, placebo: bool) -> dict[str, Path]:
    """The GRPO and the CSD params files, identical but for the phase section."""
    params = copy.deepcopy(base)
    params["tracking"]["enabled"] = False
    params.pop("agent_csd", None)
    g = params["agent_grpo"]
    g["resume"] = "never"            # --repeat reruns into the same output_dir from scratch
    g["output_dir"] = str(out / "agent_grpo")
    grpo = copy.deepcopy(params)
    csd = copy.deepcopy(params)
    c = copy.deepcopy(g)
    c.update(csd=_csd_section(placebo), output_dir=str(out / "agent_csd"))
    csd["agent_csd"] = c
    paths = {"agent_grpo": out / "params_grpo.yaml", "agent_csd": out / "params_csd.yaml"}
    paths["agent_grpo"].write_text(yaml.safe_dump(grpo, sort_keys=False))
    paths["agent_csd"].write_text(yaml.safe_dump(csd, sort_keys=False))
    return paths


def run_job(phase: str, path: Path, cwd: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)}
    env.pop("MLFLOW_RUN_ID", None)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", f"mimesis_lab.jobs.{phase}", "--phase", phase, "--params", str(path)],
                         cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        sys.stderr.write(f"--- {phase} failed (rc {res.returncode}); stderr tail:\n{res.stderr[-4000:]}\n")
        raise SystemExit(res.returncode or 1)
    return wall


def train_metrics(out_dir: Path) -> list[dict]:
    recs = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["metrics"] for r in sorted((r for r in recs if r.get("kind") == "train"), key=lambda r: r["step"])]


def step1_batch(out_dir: Path) -> list:
    """The step-1 episodes, minus their wall times (for the same-batch check)."""
    eps = []
    for ln in (out_dir / "rollouts.jsonl").read_text().splitlines():
        if ln.strip():
            r = json.loads(ln)
            if r.get("step") == 1:
                eps.append([r.get("traj_id"), r.get("messages"), r.get("total_reward"), r.get("turn_rewards")])
    return sorted(eps, key=lambda e: str(e[0]))


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else float("nan")


def _ratio(a, b):
    return a / b if b else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="work dir (default: a fresh temp dir)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=1, help="GRPO/CSD job pairs, alternating")
    ap.add_argument("--placebo", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--turns", type=int, default=1, help="csd.turns_per_trajectory")
    ap.add_argument("--teacher-cache", action=argparse.BooleanOptionalAction, default=True,
                    help="csd.teacher_cache (default on; --no-teacher-cache scores the full teacher rows)")
    ap.add_argument("--ask", action=argparse.BooleanOptionalAction, default=True,
                    help="warm-start on oracle traces that ask the user once (default; without it the agent "
                         "never asks and CSD has no rows)")
    ap.add_argument("--varied-user", action=argparse.BooleanOptionalAction, default=True,
                    help="scripted user with varied answers (default; the fixed one of the signal script makes "
                         "every template note identical, so no placebo row can ever be drawn)")
    args = ap.parse_args(argv)
    global TURNS, TEACHER_CACHE
    TURNS, TEACHER_CACHE = args.turns, args.teacher_cache

    out = (args.out or Path(tempfile.mkdtemp(prefix="bench_csd_"))).resolve()
    t0 = time.perf_counter()
    base_path = build(out, steps=args.steps, tracking_uri=None, seed=11, lr=2e-3, prompts=args.prompts,
                      rollouts=args.rollouts, ask=args.ask)
    print(f"built {out} in {time.perf_counter() - t0:.1f}s", flush=True)
    base = yaml.safe_load(base_path.read_text())
    srv = serve_user(varied_reply if args.varied_user else None)
    try:
        base["agent_grpo"]["user"]["openai"]["base_url"] = f"http://127.0.0.1:{srv.server_port}/v1"
        paths = write_params(base, out, args.placebo)
        per = {"agent_grpo": [], "agent_csd": []}
        same_batch = []
        for i in range(args.repeat):
            for phase in ("agent_grpo", "agent_csd"):
                wall = run_job(phase, paths[phase], out)
                ms = train_metrics(out / phase)
                per[phase].append(ms)
                print(f"[{i + 1}/{args.repeat}] {phase}: {len(ms)} steps, job wall {wall:.1f}s", flush=True)
            same_batch.append(step1_batch(out / "agent_grpo") == step1_batch(out / "agent_csd"))
    finally:
        srv.shutdown()

    def col(phase, key, step=None):
        return [m.get(key) for run in per[phase] for j, m in enumerate(run) if step is None or j == step - 1]

    def upd(phase, step=None):
        return [m["step_time_s"] - m["rollout_time_s"] for run in per[phase] for j, m in enumerate(run)
                if step is None or j == step - 1]

    g1, c1 = _mean(col("agent_grpo", "step_time_s", 1)), _mean(col("agent_csd", "step_time_s", 1))
    ga, ca = _mean(col("agent_grpo", "step_time_s")), _mean(col("agent_csd", "step_time_s"))
    gu1, cu1 = _mean(upd("agent_grpo", 1)), _mean(upd("agent_csd", 1))
    gu, cu = _mean(upd("agent_grpo")), _mean(upd("agent_csd"))
    gr, cr = _mean(col("agent_grpo", "rollout_time_s")), _mean(col("agent_csd", "rollout_time_s"))
    res = {
        "config": {"steps": args.steps, "prompts": args.prompts, "rollouts": args.rollouts, "repeat": args.repeat,
                   "placebo": args.placebo, "ask_warm_start": args.ask,
                   "varied_user": args.varied_user, "out": str(out), "target_step_time_ratio": TARGET},
        "same_step1_batch": all(same_batch),
        "step1_time_s": {"grpo": g1, "csd": c1, "ratio": _ratio(c1, g1)},
        "mean_step_time_s": {"grpo": ga, "csd": ca, "ratio": _ratio(ca, ga)},
        "mean_rollout_time_s": {"grpo": gr, "csd": cr, "ratio": _ratio(cr, gr)},
        "step1_update_time_s": {"grpo": gu1, "csd": cu1, "ratio": _ratio(cu1, gu1)},
        "mean_update_time_s": {"grpo": gu, "csd": cu, "ratio": _ratio(cu, gu)},
        "csd": {"post_pass_time_s": _mean(col("agent_csd", "csd/post_pass_time_s")),
                "rows": _mean(col("agent_csd", "csd/rows")),
                "placebo_rows": _mean(col("agent_csd", "csd/placebo_rows")),
                "tokens": _mean(col("agent_csd", "csd/tokens")),
                "update_tokens": _mean(col("agent_csd", "update/tokens")),
                "grpo_update_tokens": _mean(col("agent_grpo", "update/tokens"))},
        "per_step_time_s": {p: [[m["step_time_s"] for m in run] for run in per[p]] for p in per},
    }
    res["csd"]["tokens_over_update_tokens"] = _ratio(res["csd"]["tokens"], res["csd"]["update_tokens"])
    res["pass"] = bool(res["step1_time_s"]["ratio"] <= TARGET and res["mean_step_time_s"]["ratio"] <= TARGET)

    print(f"\nCSD vs GRPO — {args.steps} steps x {args.prompts} prompts x {args.rollouts} rollouts, "
          f"repeat {args.repeat}, placebo {'on' if args.placebo else 'off'}; "
          f"same step-1 batch: {res['same_step1_batch']}")
    print(f"{'':22}{'GRPO':>10}{'CSD':>10}{'CSD/GRPO':>10}")
    for label, key in (("step 1 step_time_s", "step1_time_s"), ("mean step_time_s", "mean_step_time_s"),
                       ("mean rollout_time_s", "mean_rollout_time_s"), ("step 1 update s", "step1_update_time_s"),
                       ("mean update s", "mean_update_time_s")):
        r = res[key]
        print(f"{label:22}{r['grpo']:10.3f}{r['csd']:10.3f}{r['ratio']:9.2f}x")
    c = res["csd"]
    print(f"csd: post-pass {c['post_pass_time_s']:.3f}s/step, rows {c['rows']:.1f}, placebo rows "
          f"{c['placebo_rows']:.1f}, tokens {c['tokens']:.0f} vs update tokens {c['update_tokens']:.0f} "
          f"({c['tokens_over_update_tokens']:.2f}x; GRPO update tokens {c['grpo_update_tokens']:.0f})")
    print(f"target step-time ratio <= {TARGET}x (step 1 and mean): {'PASS' if res['pass'] else 'FAIL'}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
