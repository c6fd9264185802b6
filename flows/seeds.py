"""Prefect flow ``seeds``: the whole chain re-run with other seeds, and its effects pooled over the chains.

One ``dvc repro`` is one draw of every effect (:mod:`mimesis_lab.evals.seeds` says why that is not enough).
For each seed this flow

1. clones the committed project (``HEAD``) into ``<work_dir>/seed-<seed>`` (kept: a re-run of the flow resumes,
   ``dvc repro`` skipping what is done; at a later commit the clone is moved to it and only the stages the
   change touched re-run), points the clone's DVC cache at this project's cache (the data stages'
   outputs come from it instead of being recomputed) and checks the outputs out;
2. writes the clone's ``params.yaml`` with every training seed set to the chain's seed
   (:data:`~mimesis_lab.evals.seeds.SEED_KEYS`; also ``world.seed`` with ``vary_world``), and MLflow tracking
   into this project's database under the experiment ``<experiment>`` (registered models suffixed ``-seeds``,
   so the chains never move this project's model aliases);
3. runs ``dvc repro`` there (log: ``<work_dir>/seed-<seed>/repro.log``; the chain's Prefect flow runs show in
   this project's Prefect UI) and reads its ``metrics/report.json``.

A chain that fails is recorded with its reason and left out of the pooling, never dropped silently. The
workspace's own run (``metrics/report.json``, its seed as written in ``params.yaml``) is the first chain when
``dvc status`` says it is up to date. Writes ``metrics/seeds.json`` (every chain's effects and the pooled ones),
``reports/seeds.md`` and one MLflow run ``seeds`` (pooled means and pass counts as metrics, both files as
artifacts).

Run: ``python -m flows.seeds --seeds 1235 1236 1237`` (``make seeds``); one chain takes as long as the
training stages of ``dvc repro`` (about 12.5 min on 2 CPU cores), the chains run one after another.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("PREFECT_HOME", str(ROOT / ".prefect"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402

from flows.prefect_api import shared_server  # noqa: E402
from mimesis_lab import tracking  # noqa: E402
from mimesis_lab.config import load_params, yaml_load  # noqa: E402
from mimesis_lab.evals import seeds as S  # noqa: E402

DEFAULT_SEEDS = (1235, 1236, 1237)


class ChainError(RuntimeError):
    """A chain could not be prepared or run; the message names the step and the log."""


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def workspace_commit(root: Path, allow_dirty: bool = False) -> str:
    """``HEAD`` of ``root``; a ``ChainError`` when tracked files differ from it (the chains run the commit, so a
    user's uncommitted edit would silently not be in them), unless ``allow_dirty``."""
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    if dirty and not allow_dirty:
        raise ChainError("the chains run the committed project, but tracked files are modified:\n" + dirty
                         + "\ncommit them first (or pass --allow-dirty to run HEAD anyway)")
    return _git(root, "rev-parse", "HEAD")


def tracking_overrides(root: Path, section: Mapping[str, Any], experiment: str) -> dict[str, Any]:
    """The chain's ``tracking`` section: this project's MLflow database and artifact root (absolute), the given
    experiment, registered-model names suffixed ``-seeds``."""
    out = dict(section)
    uri = str(out.get("tracking_uri", "sqlite:///mlflow/mlflow.db"))
    if uri.startswith("sqlite:///") and not uri[len("sqlite:///"):].startswith("/"):
        uri = "sqlite:///" + str((root / uri[len("sqlite:///"):]).resolve())
    art = Path(str(out.get("artifact_location", "mlflow/artifacts")))
    out.update(tracking_uri=uri, artifact_location=str(art if art.is_absolute() else (root / art).resolve()),
               experiment=experiment, simulator_model=f"{out.get('simulator_model', 'mimesis-simulator')}-seeds",
               agent_model=f"{out.get('agent_model', 'mimesis-agent')}-seeds")
    return out


def chain_params(data: Mapping[str, Any], seed: int, *, vary_world: bool, root: Path, experiment: str) -> dict:
    """The chain's params mapping: :func:`~mimesis_lab.evals.seeds.chain_overrides` applied, tracking redirected."""
    out = S.apply_overrides(data, S.chain_overrides(seed, vary_world))
    out["tracking"] = tracking_overrides(root, out.get("tracking") or {}, experiment)
    return out


def prepare_chain(root: Path, dest: Path, commit: str, seed: int, *, vary_world: bool, experiment: str,
                  env: Mapping[str, str]) -> None:
    """Clone ``commit`` into ``dest`` (or move an earlier clone to it, keeping its outputs), share ``root``'s DVC cache, check the
    outputs out and write the chain's ``params.yaml`` (validated)."""
    import yaml

    if dest.exists() and not (dest / ".git").exists():
        shutil.rmtree(dest)
    if dest.exists():           # an earlier chain: move it to ``commit``, keeping its outputs (dvc repro then
        _git(dest, "fetch", "--quiet", "origin")              # re-runs only what the change touched)
        # The chain's own dvc.lock, metrics and reports are tracked files of the commit (its outputs differ from
        # the commit's, the workspace run's): kept across the checkout, or DVC would see every stage as changed.
        kept = {f: (dest / f).read_bytes() for f in _git(dest, "diff", "--name-only", "HEAD").splitlines()
                if f != "params.yaml" and (dest / f).is_file()}
        _git(dest, "checkout", "--quiet", "--force", "--detach", commit)
        for f, data in kept.items():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            (dest / f).write_bytes(data)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        _git(root, "clone", "--quiet", "--shared", "--no-checkout", str(root), str(dest))
        _git(dest, "checkout", "--quiet", "--detach", commit)
    cache = subprocess.run([sys.executable, "-m", "dvc", "cache", "dir"], cwd=root, capture_output=True, text=True,
                           env=dict(env)).stdout.strip() or str(root / ".dvc" / "cache")
    subprocess.run([sys.executable, "-m", "dvc", "cache", "dir", "--local", cache], cwd=dest, check=True,
                   capture_output=True, env=dict(env))
    # Missing cache entries are fine (dvc repro recomputes them); a broken repository is not.
    subprocess.run([sys.executable, "-m", "dvc", "checkout", "--quiet"], cwd=dest, capture_output=True, env=dict(env))
    data = yaml_load((dest / "params.yaml").read_text(encoding="utf-8"))
    p = dest / "params.yaml"
    p.write_text(yaml.safe_dump(chain_params(data, seed, vary_world=vary_world, root=root, experiment=experiment),
                                sort_keys=False, allow_unicode=True), encoding="utf-8")
    load_params(p)          # a clear error now rather than a failed stage later


RUNS_FILE = "chain_runs.jsonl"


def record_run(dest: Path, entry: Mapping[str, Any]) -> None:
    """Append one event (``start`` before a chain's ``dvc repro``, ``end`` after it) to the chain's run ledger
    ``<dest>/chain_runs.jsonl`` (untracked; it survives the clone's moves between commits)."""
    with (dest / RUNS_FILE).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(dict(entry)) + "\n")


def run_ledger(dest: Path) -> dict[str, Any]:
    """What the chain's ledger says of all its runs: ``wall_s_all`` (the finished runs' wall time summed — a
    chain resumed after an interruption, or moved to a later commit that re-ran some stages, took all of them,
    while the last run alone may have re-run nothing), ``runs`` (finished), ``interrupted_runs`` (started, never
    finished: their time is not known, so ``wall_s_all`` undercounts by it) and ``commits`` (distinct commits run)."""
    path = dest / RUNS_FILE
    ev = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()] if path.is_file() else []
    ends = [e for e in ev if e.get("event") == "end"]
    done = {e.get("t") for e in ends}
    return {"wall_s_all": sum(float(e.get("wall_s") or 0) for e in ends), "runs": len(ends),
            "interrupted_runs": sum(1 for e in ev if e.get("event") == "start" and e.get("t") not in done),
            "commits": len({e.get("commit") for e in ev})}


def targets_met(report: Mapping[str, Any]) -> tuple[int, int]:
    eff = report.get("effects") or {}
    return sum(1 for e in eff.values() if e.get("passed")), len(eff)


@task(name="chain", log_prints=True)
def run_chain(root: str, work_dir: str, seed: int, commit: str, vary_world: bool, experiment: str) -> dict[str, Any]:
    """One chain: prepare, ``dvc repro``, read its report. Returns ``{label, seed, status, wall_s, report | reason,
    dir}``; ``status`` is ``ok`` or ``failed`` (the reason names the step and the log's last lines)."""
    rootp = Path(root)
    dest = Path(work_dir) / f"seed-{seed}"
    label = f"seed-{seed}"
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PREFECT_HOME"] = os.environ.get("PREFECT_HOME", str(rootp / ".prefect"))
    t0 = time.time()
    base = {"label": label, "seed": seed, "dir": str(dest)}
    try:
        prepare_chain(rootp, dest, commit, seed, vary_world=vary_world, experiment=experiment, env=env)
    except Exception as exc:  # noqa: BLE001 - failures are data: recorded with their reason
        return {**base, "status": "failed", "reason": f"prepare: {type(exc).__name__}: {exc}", "wall_s": time.time() - t0}
    log = dest / "repro.log"
    print(f"[seeds] chain {label}: dvc repro in {dest} (log {log})")
    record_run(dest, {"commit": commit, "event": "start", "t": t0})
    with log.open("a", encoding="utf-8") as fh:
        rc = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=dest, stdout=fh, stderr=subprocess.STDOUT,
                            env=env).returncode
    wall = time.time() - t0
    record_run(dest, {"commit": commit, "event": "end", "t": t0, "wall_s": wall, "rc": rc})
    base.update(run_ledger(dest))
    rep = dest / "metrics" / "report.json"
    if rc != 0 or not rep.is_file():
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        return {**base, "status": "failed", "wall_s": wall,
                "reason": f"dvc repro exited {rc} (log {log}): " + " / ".join(tail)}
    report = json.loads(rep.read_text(encoding="utf-8"))
    met = targets_met(report)
    print(f"[seeds] chain {label}: {met[0]} of {met[1]} targets met, {wall:.0f} s")
    return {**base, "status": "ok", "wall_s": wall, "report": report, "targets_met": list(met)}


def workspace_chain(root: Path, seed: int | None) -> dict[str, Any]:
    """The workspace's own run (its training seed ``seed``) as a chain, when ``dvc status`` says every stage is up
    to date; else ``failed`` with the reason (its report would not be the committed recipe's)."""
    label = f"seed-{seed} (workspace)"
    st = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], cwd=root, capture_output=True, text=True)
    try:
        changed = json.loads(st.stdout or "{}")
    except json.JSONDecodeError:
        changed = {"dvc status": st.stderr.strip()}
    rep = root / "metrics" / "report.json"
    if st.returncode != 0 or changed or not rep.is_file():
        return {"label": label, "seed": seed, "status": "failed",
                "reason": "the workspace is not up to date (`dvc status`: " + ", ".join(sorted(changed)) + "); run "
                          "`dvc repro` first or pass --no-workspace"}
    report = json.loads(rep.read_text(encoding="utf-8"))
    return {"label": label, "seed": seed, "status": "ok", "wall_s": None, "report": report,
            "targets_met": list(targets_met(report)), "dir": str(root)}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def pool_and_write(chains: Sequence[Mapping[str, Any]], commit: str, vary_world: bool, output: Path,
                   report: Path) -> tuple[dict[str, Any], str]:
    """Pool the finished chains (:func:`~mimesis_lab.evals.seeds.pool_effects`), write ``output`` (every chain
    with its effects, the identical pairs, the pooled effects) and ``report`` (markdown); returns both."""
    ok = {c["label"]: {"effects": c.get("effects")} for c in chains if c["status"] == "ok"}
    pooled, same = S.pool_effects(ok), S.identical_chains(ok)
    md = S.seeds_markdown(pooled, chains, same, commit=commit, vary_world=vary_world)
    out = {"commit": commit, "vary_world": vary_world, "seed_keys": list(S.SEED_KEYS), "chains": list(chains),
           "identical_chains": [list(p) for p in same], "pooled": pooled}
    _write(output, json.dumps(out, indent=2, sort_keys=True, default=str) + "\n")
    _write(report, md)
    return out, md


@flow(name="seeds", log_prints=True)
def seeds_flow(seeds: Sequence[int] = DEFAULT_SEEDS, vary_world: bool = False, include_workspace: bool = True,
               work_dir: str = ".seeds", params_path: str = "params.yaml", output: str = "metrics/seeds.json",
               report: str = "reports/seeds.md", experiment: str = "mimesis-seeds",
               allow_dirty: bool = False) -> dict[str, Any]:
    """Re-run the chain for each of ``seeds`` and pool the effects (see the module docstring)."""
    root = ROOT
    commit = workspace_commit(root, allow_dirty)
    params = load_params(root / params_path)
    base_seed = params.model.seed if getattr(params, "model", None) else None
    seeds = [int(s) for s in seeds]
    if len(set(seeds)) != len(seeds) or (include_workspace and base_seed in seeds):
        raise ValueError(f"seeds must be distinct and differ from the workspace's ({base_seed}): {seeds}")
    chains = [workspace_chain(root, base_seed)] if include_workspace else []
    from prefect.concurrency.sync import concurrency

    from flows.prefect_api import TRAINING_LIMIT

    for s in seeds:
        # A chain is training: it waits for the phase deployments' training slot where one exists (served
        # deployments); without the limit (a plain CLI run) strict=False lets it go on.
        with concurrency(TRAINING_LIMIT, occupy=1, strict=False):
            chains.append(run_chain(str(root), str(root / work_dir), s, commit, vary_world, experiment))
    chains = [{k: v for k, v in c.items() if k != "report"} | {"effects": (c.get("report") or {}).get("effects")}
              for c in chains]
    out, md = pool_and_write(chains, commit, vary_world, root / output, root / report)
    pooled = out["pooled"]
    n_ok = sum(1 for c in chains if c["status"] == "ok")
    if params.tracking.enabled:
        cfg = params.tracking.model_copy(update={"experiment": experiment})
        run = tracking.create_run(cfg, "seeds", params={"seeds": ",".join(map(str, seeds)), "vary_world": vary_world,
                                                        "commit": commit, "chains_ok": n_ok},
                                  tags={"mimesis.kind": "seeds", **tracking.provenance("seeds")})
        c, _ = tracking.client(cfg)
        metrics = {}
        for name, e in pooled.items():
            if e.get("value") is not None:
                metrics[f"pooled/{name}"] = float(e["value"])
            metrics[f"passed_in/{name}"] = float(e["passed_in"])
        metrics["pooled/targets_met"] = float(sum(1 for e in pooled.values() if e.get("passed")))
        tracking.log_metrics(c, run, metrics)
        c.log_artifact(run, str(root / output))
        c.log_artifact(run, str(root / report))
        c.set_terminated(run, "FINISHED")
    create_markdown_artifact(markdown=md, key="mimesis-seeds", description="Effects over seeds of the whole chain")
    failed = [c["label"] for c in chains if c["status"] != "ok"]
    print(f"[seeds] {n_ok} chains pooled" + (f", failed: {', '.join(failed)}" if failed else "")
          + f"; wrote {output} and {report}")
    return out


def repool(output: Path, report: Path) -> dict[str, Any]:
    """Pool the chains recorded in ``output`` (``metrics/seeds.json``) again, without running any: rewrites its
    pooled part and ``report`` (after a change of the pooling or of the report's layout)."""
    rec = json.loads(output.read_text(encoding="utf-8"))
    return pool_and_write(rec["chains"], rec.get("commit", ""), bool(rec.get("vary_world")), output, report)[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flows.seeds", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", nargs="+", type=int, default=list(DEFAULT_SEEDS))
    ap.add_argument("--vary-world", action="store_true", help="also set world.seed to each chain's seed")
    ap.add_argument("--no-workspace", action="store_true", help="do not count the workspace's own run as a chain")
    ap.add_argument("--work-dir", default=".seeds")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--experiment", default="mimesis-seeds")
    ap.add_argument("--allow-dirty", action="store_true")
    ap.add_argument("--output", default="metrics/seeds.json", help="pooled JSON (relative to the project root)")
    ap.add_argument("--report", default="reports/seeds.md", help="pooled markdown (relative to the project root)")
    ap.add_argument("--repool", action="store_true",
                    help="run no chain: pool the chains recorded in --output again and rewrite --report")
    args = ap.parse_args(argv)
    if args.repool:
        repool(ROOT / args.output, ROOT / args.report)
        return 0
    with shared_server():
        out = seeds_flow(seeds=args.seeds, vary_world=args.vary_world, include_workspace=not args.no_workspace,
                         work_dir=args.work_dir, params_path=args.params, output=args.output, report=args.report,
                         experiment=args.experiment, allow_dirty=args.allow_dirty)
    return 0 if all(c["status"] == "ok" for c in out["chains"]) else 1


if __name__ == "__main__":
    sys.exit(main())
