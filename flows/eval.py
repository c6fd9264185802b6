"""Prefect flows of the evaluation side (SPEC §4): ``sim_eval``, ``agent_eval`` and ``report``.

Orchestration only (the work is in :mod:`mimesis_lab.evals`):
- ``sim_eval``: every simulator of ``params.sim_eval.simulators`` through the simulator benchmarks;
  an MLflow parent run ``sim_eval`` with one child run per simulator (tagged with the evaluated
  checkpoint's registered version and training run id), every metric logged, the summary JSON and
  per-conversation records as artifacts, ``metrics/sim_eval.json`` for DVC.
- ``agent_eval``: agents × gyms × evaluation users; a parent run ``agent_eval`` with one child per
  agent (tagged likewise), per-cell scores, Mean and MR per user and overall, invalid counts;
  ``metrics/agent_eval.json``.
- ``report``: the markdown comparison, opened by "Does it work?" (every phase's effect with a 95% CI
  and pass/fail against its target, :mod:`mimesis_lab.evals.effects`), then paper Table 2 shape; plots
  (MLflow artifacts, and CSVs for ``dvc plots``), ``metrics/report.json`` (headline numbers and
  ``effects``), published as a Prefect artifact.

Run: ``python -m flows.eval --phases sim_eval agent_eval report [--params params.yaml]`` (the DVC
stages run one phase each).
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("PREFECT_HOME", str(ROOT / ".prefect"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from prefect import flow, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402

from flows.crashed import claim_flow_run  # noqa: E402
from flows.prefect_api import shared_server  # noqa: E402
from mimesis_lab import tracking  # noqa: E402
from mimesis_lab.config import Params, flatten, load_params, phase_params  # noqa: E402

EVAL_PHASES = ("sim_eval", "agent_eval", "report")


# ----------------------------------------------------------------------------- flattening (pure)
def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def flat_sim(s: Mapping[str, Any]) -> dict[str, float]:
    """One simulator's summary entry -> flat finite metrics (MLflow / DVC)."""
    out: dict[str, float] = {}

    def put(k: str, v: Any) -> None:
        x = _num(v)
        if x is not None:
            out[k] = x

    for k in ("fi", "d1", "d2", "d3", "d4", "ece", "usi5", "turing_accuracy", "turing_distance"):
        put(k, s.get(k))
    if s.get("fi_ci"):
        put("fi_ci_lo", s["fi_ci"][0])
        put("fi_ci_hi", s["fi_ci"][1])
    for d, v in (s.get("fi_per_dim") or {}).items():
        put(f"fi/{d}", v)
    for k, v in (s.get("behavior") or {}).items():
        put(f"behavior/{k}", v)
    soul = s.get("soul") or {}
    put("soul/mean", soul.get("mean"))
    put("soul/se", soul.get("se"))
    for t, v in (soul.get("per_task") or {}).items():
        put(f"soul/{t}", v)
    counts = s.get("counts") or {}
    for k in ("conversations", "behavior_episodes", "judge_failures", "parse_failures"):
        put(f"counts/{k}", counts.get(k))
    for r, n in (counts.get("invalid") or {}).items():
        put(f"counts/invalid/{r}", n)
    return out


def flat_agent(summary: Mapping[str, Any], agent: str) -> dict[str, float]:
    """One agent's cells, per-user and overall Mean/MR -> flat finite metrics."""
    out: dict[str, float] = {}
    for user, by_gym in (summary.get("cells", {}).get(agent) or {}).items():
        for gym, c in by_gym.items():
            for k, name in (("score", "score"), ("pass_at_k", "pass_at_k"), ("micro_avg", "micro_avg"),
                            ("micro_max", "micro_max")):
                x = _num(c.get(k))
                if x is not None:
                    out[f"{name}/{user}/{gym}"] = x
            out[f"invalid/{user}/{gym}"] = float(c.get("invalid", 0))
    for user, agg in (summary.get("per_user") or {}).items():
        for kind, name in (("mean", "mean"), ("mean_rank", "mr")):
            x = _num((agg.get(kind) or {}).get(agent))
            if x is not None:
                out[f"{name}/{user}"] = x
    for kind, name in (("mean", "mean/overall"), ("mean_rank", "mr/overall")):
        x = _num((summary.get("overall", {}).get(kind) or {}).get(agent))
        if x is not None:
            out[name] = x
    return out


def _write_json(path: str | Path, obj: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    return path


def _record(params: Params, phase: str, entries: Mapping[str, tuple[str | None, dict[str, float]]],
            cfg: Any, artifacts: list[Path]) -> dict[str, str]:
    """Parent run ``phase`` + one child per evaluated model; returns {name: run url}."""
    if not params.tracking.enabled:
        return {}
    tracking.mark_killed_runs(params.tracking, phase)           # runs a SIGKILL left RUNNING -> FAILED
    parent = tracking.create_run(params.tracking, phase, params=flatten(cfg, f"{phase}."),
                                 tags={"mimesis.kind": "eval", "mimesis.phase": phase, **tracking.provenance(phase)})
    c, _ = tracking.client(params.tracking)
    urls = {phase: tracking.run_url(params.tracking, parent)}
    try:
        for name, (path, metrics) in entries.items():
            child = tracking.create_run(params.tracking, f"{phase}:{name}", parent, tags={
                "mimesis.kind": "eval", "mimesis.phase": phase, "mimesis.evaluated_name": name,
                **tracking.evaluated_model(params.tracking, path)})
            tracking.log_metrics(c, child, metrics)
            c.set_terminated(child, "FINISHED")
            urls[name] = tracking.run_url(params.tracking, child)
        for a in artifacts:
            if a.is_dir():
                c.log_artifacts(parent, str(a), a.name)
            elif a.is_file():
                c.log_artifact(parent, str(a))
    except BaseException:
        c.set_terminated(parent, "FAILED")
        raise
    c.set_terminated(parent, "FINISHED")
    return urls


def _links_md(urls: Mapping[str, str]) -> str:
    return "\n".join(f"- {k}: [{v}]({v})" for k, v in urls.items())


# ----------------------------------------------------------------------------- flows
@task(name="sim_eval_run", log_prints=True)
def _sim_eval_task(params_path: str) -> dict[str, Any]:
    from mimesis_lab.evals.sim_eval import run_sim_eval

    params = load_params(params_path)
    bt = params.behavior_tasks        # the ABCD files the behaviour tasks were grounded in
    return run_sim_eval(params.sim_eval, params.model, kb=bt.kb, guidelines=bt.guidelines, abcd_raw=bt.abcd_input)


@flow(name="sim_eval", log_prints=True)
def sim_eval_flow(params_path: str = "params.yaml") -> dict[str, Any]:
    """Simulator benchmarks for every configured simulator (trained one and baselines)."""
    from mimesis_lab.evals.report import sim_markdown

    claim_flow_run()                                            # flow runs a SIGKILL left RUNNING -> CRASHED
    params = load_params(params_path)
    cfg = phase_params(params, "sim_eval")
    summary = _sim_eval_task(params_path)
    flat = {n: flat_sim(s) for n, s in summary["simulators"].items()}
    _write_json(cfg.metrics, flat)
    entries = {n: (cfg.simulators[n].model_path, m) for n, m in flat.items()}
    urls = _record(params, "sim_eval", entries, cfg, [Path(cfg.output_dir)])
    create_markdown_artifact(markdown=f"# sim_eval\n\n{_links_md(urls)}\n\n{sim_markdown(summary)}\n",
                             key="sim-eval-summary", description="Simulator benchmarks")
    for n, m in flat.items():
        print(f"[sim_eval] {n}: " + ", ".join(f"{k}={m[k]:.3f}" for k in ("fi", "usi5", "turing_distance") if k in m))
    return summary


@task(name="agent_eval_run", log_prints=True)
def _agent_eval_task(params_path: str) -> dict[str, Any]:
    from mimesis_lab.evals.agent_eval import run_agent_eval

    params = load_params(params_path)
    return run_agent_eval(params.agent_eval, task_files=params.gyms.tasks, task_options=params.gyms.task_options)


@flow(name="agent_eval", log_prints=True)
def agent_eval_flow(params_path: str = "params.yaml") -> dict[str, Any]:
    """Agents × gyms × evaluation users, cached per rollout (a rerun only runs what is missing)."""
    from mimesis_lab.evals.report import table2_markdown

    claim_flow_run()                                            # flow runs a SIGKILL left RUNNING -> CRASHED
    params = load_params(params_path)
    cfg = phase_params(params, "agent_eval")
    summary = _agent_eval_task(params_path)
    flat = {a: flat_agent(summary, a) for a in summary["cells"]}
    _write_json(cfg.metrics, {"overall": summary.get("overall"), "per_user": summary.get("per_user"),
                              "counts": summary.get("counts"), "agents": flat})
    entries = {a: (cfg.agents[a], m) for a, m in flat.items()}
    urls = _record(params, "agent_eval", entries, cfg, [Path(cfg.output_dir) / "summary.json"])
    create_markdown_artifact(markdown=f"# agent_eval\n\n{_links_md(urls)}\n\n{table2_markdown(summary)}\n",
                             key="agent-eval-summary", description="Agents across evaluation users")
    print(f"[agent_eval] overall mean {summary['overall'].get('mean')} MR {summary['overall'].get('mean_rank')} "
          f"counts {summary.get('counts')}")
    return summary


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


#: Where the training flow writes each phase's summary (``flows/train.py``: ``metrics/<phase>.json``).
PHASE_METRICS = "metrics/{}.json"


def _name_of(named: Mapping[str, Any], path: str | None, default: str) -> str | None:
    """The key of ``named`` (``sim_eval.simulators`` / ``agent_eval.agents``) whose model path is ``path``."""
    for name, v in named.items():
        p = v if isinstance(v, str) else getattr(v, "model_path", None)
        if path and p and Path(p) == Path(path):
            return name
    return default if default in named else None


def _effects(params: Params) -> tuple[dict[str, Any], dict[str, str], dict[str, str | None]]:
    """The "Does it work?" effects (:mod:`mimesis_lab.evals.effects`) from the outputs named in ``params``."""
    from mimesis_lab.evals import effects as eff

    final = {ph: str(Path(sec.output_dir) / "final") for ph in ("sft", "sim_rl", "agent_sft", "agent_grpo", "agent_csd")
             if (sec := getattr(params, ph, None)) is not None}
    sims = params.sim_eval.simulators if params.sim_eval else {}
    base = next((n for n, s in sims.items() if s.kind == "base"), None)
    agents = params.agent_eval.agents if params.agent_eval else {}
    x, sha = eff.load_inputs(
        midtrain=PHASE_METRICS.format("midtrain"), sft=PHASE_METRICS.format("sft"),
        sim_rl_dir=params.sim_rl.output_dir if params.sim_rl else "models/sim_rl",
        sim_eval_dir=params.sim_eval.output_dir if params.sim_eval else "eval/sim_eval",
        agent_eval_dir=params.agent_eval.output_dir if params.agent_eval else "eval/agent_eval",
        csd_metrics=Path(params.agent_csd.output_dir if params.agent_csd else "models/agent_csd") / "metrics.jsonl",
        grpo_metrics=Path(params.agent_grpo.output_dir if params.agent_grpo else "models/agent_grpo") / "metrics.jsonl",
        checkpoints=final, train_gyms=params.gyms.train_gyms,
        sims={"trained": _name_of(sims, final.get("sim_rl"), "mimesis"), "sft": _name_of(sims, final.get("sft"), "sft"),
              "base": base},
        agents={ph: _name_of(agents, final.get(ph), d) for ph, d in
                (("agent_sft", "base"), ("agent_grpo", "grpo"), ("agent_csd", "csd"))})
    return eff.compute_effects(x), x.identical, sha


def flat_effects(effects: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """``effects/<name>`` (value) and ``effects/<name>/passed`` (0/1) for MLflow (finite values only)."""
    out: dict[str, float] = {}
    for name, e in effects.items():
        v = _num(e.get("value"))
        if v is not None:
            out[f"effects/{name}"] = v
        out[f"effects/{name}/passed"] = float(bool(e.get("passed")))
    return out


@flow(name="report", log_prints=True)
def report_flow(params_path: str = "params.yaml") -> str:
    """The comparison report: markdown (Table 2 shape), plots, DVC plot data, MLflow + Prefect artifacts."""
    from mimesis_lab.evals import report as rep

    claim_flow_run()
    params = load_params(params_path)
    cfg = phase_params(params, "report")
    sim = _load(Path(params.sim_eval.output_dir) / "summary.json") if params.sim_eval else None
    agent = _load(Path(params.agent_eval.output_dir) / "summary.json") if params.agent_eval else None
    runs = {}
    for phase in ("agent_grpo", "agent_csd"):
        sec = getattr(params, phase, None)
        if sec is not None:
            runs[phase] = Path(sec.output_dir) / "metrics.jsonl"
    curves = rep.training_curves(runs)
    plots_dir = Path(cfg.plots_dir)
    plots = rep.write_plots(plots_dir, sim, agent, curves)
    rep.write_csv(plots_dir / "reward_curves.csv", rep.curve_rows(curves), ["method", "step", "reward"])
    rep.write_csv(plots_dir / "per_gym.csv", rep.per_gym_rows(agent or {}),
                  ["method", "user", "gym", "score", "status", "invalid"])
    rep.write_csv(plots_dir / "fi_dims.csv", rep.fi_rows(sim or {}), ["simulator", "dimension", "score"])
    head = rep.headline(sim, agent)
    effects, identical, sha = _effects(params)
    _write_json(cfg.metrics, {**head, "effects": effects, "identical_checkpoints": identical,
                              "weights_sha256": sha})
    urls: dict[str, str] = {}
    if params.tracking.enabled:
        tracking.mark_killed_runs(params.tracking, "report")
        run = tracking.create_run(params.tracking, "report", tags={"mimesis.kind": "report",
                                                                   **tracking.provenance("report")})
        c, _ = tracking.client(params.tracking)
        tracking.log_metrics(c, run, {**head, **flat_effects(effects)})
        urls["report"] = tracking.run_url(params.tracking, run)
    md = rep.report_markdown(sim, agent, curves, urls, [str(p) for p in plots], effects, identical)
    out = Path(cfg.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    if params.tracking.enabled:
        c.log_artifact(run, str(out))
        c.log_artifacts(run, str(plots_dir), "plots")
        c.set_terminated(run, "FINISHED")
    create_markdown_artifact(markdown=md, key="mimesis-report", description="MIMESIS comparison report")
    print(f"[report] wrote {out} and {len(plots)} plots to {plots_dir}")
    return md


FLOWS = {"sim_eval": sim_eval_flow, "agent_eval": agent_eval_flow, "report": report_flow}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flows.eval")
    ap.add_argument("--phases", nargs="+", default=list(EVAL_PHASES), choices=list(FLOWS))
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args(argv)
    with shared_server():       # one Prefect API server for the whole dvc repro (flows/prefect_api.py)
        for phase in [p for p in EVAL_PHASES if p in args.phases]:
            FLOWS[phase](params_path=args.params)
    return 0


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main())
