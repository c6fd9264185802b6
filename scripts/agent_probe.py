"""Agent effects with power: the trained agents of one or more chains on many *unseen* tasks of a fresh world.

The default ``agent_eval`` plays 4 tasks a gym (the training gyms have 4 val tasks each), so a per-chain agent
effect rests on 12 task x user pairs a gym and moves by more than its CI from one chain to the next. This probe
draws a fresh world (``--world-seed``, not the chains' world; ``--gym-tasks`` tasks a gym, none seen in training:
the task ids and the users behind them are new), builds its gym rows with the real ``gyms`` stage, and runs the real
``agent_eval`` phase in each chain's folder (its ``base``/``grpo``/``csd`` agents) against the scripted user
(cooperative, answers from the task's hidden spec: no model, so hundreds of rollouts take about a minute), greedy
as in ``agent_eval``. Per chain and gym: the paired (per task) differences GRPO - warm start and CSD - GRPO with a
percentile bootstrap CI over tasks, computed as the report computes its agent effects
(:func:`mimesis_lab.evals.effects.agent_vs`); pooled over chains: their
mean and 95% t-interval (:func:`mimesis_lab.evals.seeds.t_ci`) and how many chains are above 0.

    python scripts/agent_probe.py --chains . .seeds/seed-1235 .seeds/seed-1236 .seeds/seed-1237 \\
        --work /tmp/agent_probe --out /tmp/agent_probe/probe.json

Each chain's evaluation is cached under ``<work>/<chain>/cache`` (the ``agent_eval`` rollout cache): a re-run
evaluates only what changed. Writes ``--out`` (JSON: every chain's per-gym effects and the pooled ones) and prints
a markdown table; ``--report`` also writes it as a markdown report (the committed one: ``reports/agent_probe.md``)
and logs an MLflow run ``agent_probe``. ``--gyms`` picks the gyms (default: the ones where some agent scores: travel, turtle, persuade,
and the held-out intention); ``train`` in the output pools the training gyms among them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PAIRS = (("grpo", "base"), ("csd", "grpo"))
DEFAULT_GYMS = ("travel", "turtle", "persuade", "intention")


def chain_effects(rollouts: Sequence[Mapping[str, Any]], gyms: Sequence[str],
                  train_gyms: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per gym (and ``train``: the training gyms among ``gyms`` pooled), per pair ``a-b``: the report's own
    paired comparison (:func:`mimesis_lab.evals.effects.agent_vs`: pairs over user x gym x task x attempt, invalid
    rollouts left out by ``agent_eval``'s rule, bootstrap CI) -- its value, CI, pairs, unpaired rollouts -- and
    both agents' means over the pairs (from its per-gym breakdown)."""
    from mimesis_lab.evals.effects import agent_vs

    out: dict[str, dict[str, Any]] = {}
    groups = {g: (g,) for g in gyms}
    pooled = tuple(g for g in gyms if g in train_gyms)
    if len(pooled) > 1:
        groups["train"] = pooled
    for name, members in groups.items():
        for a, b in PAIRS:
            e = agent_vs(rollouts, a, b, members)
            if e.get("missing_reason"):
                continue
            by_gym = e["by_gym"].values()
            out.setdefault(name, {})[f"{a}-{b}"] = {
                "value": e["value"], "ci": e["ci"], "n": e["n"], "unpaired": e["unpaired"],
                a: sum(g["a"] * g["n"] for g in by_gym) / e["n"], b: sum(g["b"] * g["n"] for g in by_gym) / e["n"]}
    return out


def pool(per_chain: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Over chains, per gym and pair: every chain's value, the mean, the 95% t-interval and the chains above 0."""
    from mimesis_lab.evals.seeds import t_ci

    out: dict[str, dict[str, Any]] = {}
    names = sorted({(g, p) for eff in per_chain.values() for g, ps in eff.items() for p in ps})
    for g, p in names:
        vals = [eff[g][p]["value"] for eff in per_chain.values() if p in eff.get(g, {})]
        out.setdefault(g, {})[p] = {"values": vals, "mean": sum(vals) / len(vals), "ci": t_ci(vals),
                                    "above_zero": sum(v > 0 for v in vals), "chains": len(vals)}
    return out


def markdown(per_chain: Mapping[str, Mapping[str, Mapping[str, Any]]], pooled: Mapping[str, Mapping[str, Any]]) -> str:
    def ci(c: Sequence[float] | None) -> str:
        return "–" if not c else f"[{c[0]:+.3f}, {c[1]:+.3f}]"

    chains = list(per_chain)
    lines = ["| Gym | Effect | " + " | ".join(chains) + " | Mean | 95% CI (chains) | Chains > 0 |",
             "|---|---|" + "---|" * len(chains) + "---|---|---|"]
    for g in sorted(pooled, key=lambda x: (x == "train", x)):
        for p, e in pooled[g].items():
            cells = []
            for c in chains:
                x = per_chain[c].get(g, {}).get(p)
                cells.append("–" if x is None else f"{x['value']:+.3f} {ci(x['ci'])} n{x['n']}")
            lines.append(f"| {g} | {p} | " + " | ".join(cells) + f" | {e['mean']:+.3f} | {ci(e['ci'])} | "
                         f"{e['above_zero']} of {e['chains']} |")
    return "\n".join(lines)


def make_world(work: Path, seed: int, gym_tasks: int) -> Path:
    """A fresh world's gym tasks and the ``gyms`` stage's rows of them under ``work`` (the rows' folder)."""
    from mimesis_lab.config import load_params, yaml_load
    from mimesis_lab.envs.gyms.registry import ALL_GYMS
    from mimesis_lab.world import WorldParams, generate_world
    from stages import gyms as G
    from stages.common import write_result

    world = work / "world"
    data = yaml_load((ROOT / "params.yaml").read_text())
    section = {k: v for k, v in (data.get("world") or {}).items() if k != "output_dir"}   # the project's world
    generate_world(WorldParams(**{**section, "seed": seed, "gym_tasks": gym_tasks}), world)   # but a fresh draw
    data["tracking"] = {"enabled": False}
    data["gyms"]["tasks"] = {g: str(world / "gyms" / g / "tasks.json") for g in ALL_GYMS}
    data["gyms"]["output_dir"] = str(work / "gyms")
    params_path = work / "params.yaml"
    params_path.write_text(yaml.safe_dump(data, sort_keys=False))
    cwd = os.getcwd()
    os.chdir(work)
    try:
        write_result(G.STAGE, G.build(load_params(params_path)))
    finally:
        os.chdir(cwd)
    return work / "gyms"


def eval_params(chain: Path, work: Path, out: Path, gyms: Sequence[str]) -> Path:
    """The chain's own params with ``agent_eval`` pointed at the probe's rows and tasks (``work``: the folder of
    :func:`make_world`), the scripted user, every task."""
    from mimesis_lab.config import yaml_load

    data = yaml_load((chain / "params.yaml").read_text())
    probe = yaml_load((work / "params.yaml").read_text())
    data["tracking"] = {"enabled": False}
    data["gyms"]["tasks"] = probe["gyms"]["tasks"]        # the rows' tasks are looked up there
    rows = Path(probe["gyms"]["output_dir"])
    ae = data["agent_eval"]
    ae.update(users={"scripted": {"kind": "scripted"}}, gyms=list(gyms), tasks_per_gym=None,
              data=[str(rows / f"{s}.parquet") for s in ("train", "val", "test")],
              output_dir=str(out / "agent_eval"), cache_dir=str(out / "cache"), metrics=str(out / "agent_eval.json"))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "params.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chains", nargs="+", default=["."], help="project folders with trained agents (models/)")
    ap.add_argument("--world-seed", type=int, default=4321, help="seed of the fresh world (not the chains')")
    ap.add_argument("--gym-tasks", type=int, default=60, help="tasks a gym in the fresh world")
    ap.add_argument("--gyms", nargs="+", default=list(DEFAULT_GYMS))
    ap.add_argument("--work", default="/tmp/agent_probe")
    ap.add_argument("--out", default=None, help="JSON result (default: <work>/probe.json)")
    ap.add_argument("--report", default=None, help="also write the table as markdown here (e.g. "
                    "reports/agent_probe.md) and log the pooled effects as the MLflow run `agent_probe`")
    args = ap.parse_args(argv)
    from mimesis_lab.config import load_params

    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    make_world(work, args.world_seed, args.gym_tasks)
    train_gyms = load_params(ROOT / "params.yaml").gyms.train_gyms
    per_chain: dict[str, dict] = {}
    for c in args.chains:
        chain = Path(c).resolve()
        name = "workspace" if chain == ROOT else chain.name
        out = work / name
        params = eval_params(chain, work, out, args.gyms)
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        log = out / "eval.log"
        with log.open("w") as fh:
            rc = subprocess.run([sys.executable, "-m", "flows.eval", "--phases", "agent_eval", "--params", str(params)],
                                cwd=chain, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
        if rc:
            print(f"{name}: agent_eval failed (rc {rc}), see {log}", file=sys.stderr)
            return rc
        rollouts = [json.loads(x) for x in (out / "agent_eval" / "rollouts.jsonl").read_text().splitlines() if x]
        per_chain[name] = chain_effects(rollouts, args.gyms, train_gyms)
    pooled = pool(per_chain)
    result = {"world_seed": args.world_seed, "gym_tasks": args.gym_tasks, "user": "scripted", "chains": per_chain,
              "pooled": pooled}
    out_path = Path(args.out or work / "probe.json")
    out_path.write_text(json.dumps(result, indent=2))
    table = markdown(per_chain, pooled)
    print(table)
    if args.report:
        write_report(Path(args.report), table, args, out_path, result)
    return 0


def write_report(path: Path, table: str, args: argparse.Namespace, out_path: Path, result: Mapping[str, Any]) -> None:
    """The markdown report, and one MLflow run ``agent_probe`` (pooled means and chains above 0 as metrics, both
    files as artifacts) when the project's tracking is on."""
    from mimesis_lab import tracking
    from mimesis_lab.config import load_params

    commit = tracking.git_commit(ROOT) or "unknown"
    head = (f"# Agent effects on unseen tasks (`scripts/agent_probe.py`)\n\n"
            f"The chains' agents (`base` = warm start, `grpo`, `csd`) on {args.gym_tasks} unseen tasks a gym of a "
            f"fresh world (seed {args.world_seed}), the scripted user, greedy, at commit `{commit[:12]}`. Each cell: "
            f"the mean paired (per task) difference, its bootstrap 95% CI over tasks and the pairs; Mean and CI "
            f"over chains (t-interval). `train` pools the training gyms among those probed.\n\n"
            f"`python scripts/agent_probe.py --chains {' '.join(args.chains)} --gym-tasks {args.gym_tasks} "
            f"--world-seed {args.world_seed} --report {path}`\n\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + table + "\n")
    params = load_params(ROOT / "params.yaml")
    if not params.tracking.enabled:
        return
    run = tracking.create_run(params.tracking, "agent_probe",
                              params={"chains": ",".join(args.chains), "world_seed": args.world_seed,
                                      "gym_tasks": args.gym_tasks, "commit": commit},
                              tags={"mimesis.kind": "agent_probe"})
    c, _ = tracking.client(params.tracking)
    metrics = {}
    for g, pairs in result["pooled"].items():
        for p, e in pairs.items():
            metrics[f"pooled/{g}/{p}"] = float(e["mean"])
            metrics[f"above_zero/{g}/{p}"] = float(e["above_zero"])
    tracking.log_metrics(c, run, metrics)
    c.log_artifact(run, str(out_path))
    c.log_artifact(run, str(path))
    c.set_terminated(run, "FINISHED")
    print(f"[agent_probe] wrote {path}; MLflow run {run}")


if __name__ == "__main__":
    raise SystemExit(main())
