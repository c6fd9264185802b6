"""CSD validity check: GRPO vs GRPO + CSD siblings over several seeds, both curves in MLflow.

The setting is the agent learning-signal configuration (:mod:`scripts.agent_grpo_signal`):
TravelGym, a tiny agent warm-started on oracle traces of which half first ask the user what
matters (so the agent consults the user and the coach has reasoning to work from), and a scripted user whose *private reasoning* names what
the user cares about (``price``, ``location``) while its public reply is vaguer — so the
reasoning carries information the public reply lacks, and the (offline, template) coach turns it
into a prospective note without values (the leak validator drops any note that would reveal
the hidden preferences). For each seed the two runs share everything (initial agent, data,
seed, batch shape); only ``alpha`` differs (0 → GRPO via the ``agent_grpo`` phase; 0.01 → CSD via
``agent_csd``). Reported: mean reward over the last ``--window`` steps per run, the mean over
seeds per method, and the per-step curves (MLflow experiment ``csd-validity``: one pair of sibling
runs per seed, compare ``reward/mean``).

    python scripts/csd_validity.py --out /tmp/csd_validity [--seeds 11 12 13] [--steps 30]
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts import agent_grpo_signal as sig  # noqa: E402

PRIVATE_REPLY = ("<think>They have not asked about my budget or the location yet; I want something cheap near the "
                 "beach but I will only say it if asked.</think>Hmm, I am not sure, it depends.")


def csd_section(grpo: dict, alpha: float, out_dir: str) -> dict:
    sec = copy.deepcopy(grpo)
    sec.update(output_dir=out_dir, csd={"alpha": alpha, "beta": 5.0, "placebo": True, "placebo_min_pool": 8,
                                         "turns_per_trajectory": 2, "require_reply": False, "skip_gyms": [],
                                         "leak_check": True, "max_teacher_tokens": 2304,
                                         "coach": {"kind": "template", "style": "prospective"}})
    return sec


def run_pair(out: Path, seed: int, steps: int, uri: str, experiment: str) -> dict:
    work = out / f"seed{seed}"
    sig.USER_REPLY = PRIVATE_REPLY
    p = sig.build(work, steps=steps, tracking_uri=uri, experiment=experiment, seed=seed, ask=True)
    params = yaml.safe_load(p.read_text())
    params["agent_csd"] = csd_section(params["agent_grpo"], 0.01, str(work / "agent_csd"))
    p.write_text(yaml.safe_dump(params, sort_keys=False))
    res = {}
    for phase in ("agent_grpo", "agent_csd"):
        r = sig.run(p, work, timeout=3600, phase=phase)
        if r.returncode != 0:
            raise SystemExit(f"seed {seed} {phase} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        res[phase] = curve(work / phase)
    return res


def curve(run_dir: Path) -> list[float]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["metrics"].get("reward/mean", 0.0) for r in recs if r.get("kind") == "train"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[11, 12, 13])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--tracking-uri", default=None, help="default: <out>/mlflow.db")
    ap.add_argument("--experiment", default="csd-validity")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    uri = args.tracking_uri or f"sqlite:///{out / 'mlflow.db'}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = f"sqlite:///{(Path.cwd() / uri[len('sqlite:///'):]).resolve()}"
    results = {}
    for seed in args.seeds:
        results[seed] = run_pair(out, seed, args.steps, uri, args.experiment)
        tail = {k: sum(v[-args.window:]) / len(v[-args.window:]) for k, v in results[seed].items()}
        print(f"seed {seed}: last-{args.window} mean reward GRPO {tail['agent_grpo']:.3f} CSD {tail['agent_csd']:.3f}",
              flush=True)
    summary = {}
    for phase in ("agent_grpo", "agent_csd"):
        tails = [sum(r[phase][-args.window:]) / len(r[phase][-args.window:]) for r in results.values()]
        summary[phase] = {"mean_last_window": sum(tails) / len(tails), "per_seed": tails}
    summary["csd_minus_grpo"] = summary["agent_csd"]["mean_last_window"] - summary["agent_grpo"]["mean_last_window"]
    (out / "summary.json").write_text(json.dumps({"summary": summary, "curves": results}, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
