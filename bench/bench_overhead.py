"""Orchestration overhead: what a stage pays around its own work, piece by piece and over a whole run.

Two parts (both by default; ``--pieces-only`` / ``--run-only`` pick one):

1. **Pieces**, timed as subprocesses, variants interleaved (A, B, B, A, …) after one warm-up each,
   reported as median [min–max] seconds and the ratio of medians:

   - *flow start*: a Python process that runs one trivial Prefect flow, with Prefect's temporary server
     per flow run (``MIMESIS_PREFECT_SERVER=ephemeral``, what every flow did before) vs the shared server
     of :mod:`flows.prefect_api` (started by the warm-up, reused as in a ``dvc repro``);
   - *job launch*: a no-op distributed job (imports DeepSpeed, joins a gloo process group, exits)
     started with the ``deepspeed`` launcher vs ``torchrun`` vs ``direct`` (the module started without a
     launcher process; :func:`mimesis_lab.train.launch.build_command`).

2. **A whole run**: ``dvc repro -f`` of the project in a fresh clone (``--clone``, default) or the log of
   one (``--log FILE``, ``--project`` the folder it ran in). Best timestamped, each line prefixed with the
   epoch second (what the clone run writes; by hand: ``dvc repro -f 2>&1 | while IFS= read -r l; do printf
   '%s %s\\n' "$(date +%s)" "$l"; done | tee repro.log``). A plain log is refused with that advice, or,
   with ``--mtimes``, timed approximately by the mtimes of each stage's outputs (``dvc.lock``; the first
   stage's wall time then unknown). Per stage: wall time (from ``Running stage`` to the next), the stage's
   own work (the ``code`` stage, which writes the code fingerprints DVC compares: none, it is all overhead;
   data stages: the ``work`` they log; training stages: the job's ``final.wall_time_s`` in
   ``models/<phase>/metrics.jsonl`` (from the job's opening — process group, fingerprint and resume check done —
   to its export: tokenizer, model, DeepSpeed engine and data loading included, the same point for the SFT and
   the RL jobs; the RL jobs once counted from their first step, which put their model and engine loading and the
   user side's start in the overhead) plus the flow's evaluation of the final model, ``final_eval_wall_time_s``
   in ``metrics/<phase>.json`` (midtrain's unigram baseline, sft's format check); evaluation stages: the flow run's body, from ``Beginning flow run`` to
   ``Finished in state``, by the line prefixes or Prefect's own time of day), and overhead = wall − work;
   in total, the overhead share of the run.

    python bench/bench_overhead.py [--repeat 5] [--pieces-only | --run-only] [--log repro.log [--project DIR]
                                   [--mtimes]] [--out f.json]

Not a test: run on an otherwise idle machine (2 cores: anything else running distorts every figure).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mimesis_lab.code_deps import CODE_STAGE  # noqa: E402

FLOW_CODE = """
from prefect import flow
from flows.prefect_api import shared_server
@flow(name="bench_noop")
def noop():
    return 1
with shared_server():
    noop()
"""

NOOP_JOB = """
import os, deepspeed, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"), "OMP_NUM_THREADS": "1"}
    env.pop("PREFECT_API_URL", None)
    env.update(extra)
    return env


def _timed(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    t = time.perf_counter()
    res = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return time.perf_counter() - t


def _interleaved(variants: dict[str, tuple[list[str], dict[str, str]]], cwd: Path, repeat: int) -> dict:
    names = list(variants)
    for n in names:                                   # warm-up (and, for the shared server, its start)
        _timed(*variants[n], cwd)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeat):
        for n in (names if r % 2 == 0 else names[::-1]):
            times[n].append(_timed(*variants[n], cwd))
    return {n: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t), "runs": t} for n, t in times.items()}


def pieces(repeat: int) -> dict:
    from mimesis_lab.train.launch import build_command, free_port

    work = Path(tempfile.mkdtemp(prefix="bench_overhead_"))
    home = work / "prefect"
    flow_cmd = [sys.executable, "-c", FLOW_CODE]
    flows = _interleaved({
        "ephemeral": (flow_cmd, _env(PREFECT_HOME=str(home), MIMESIS_PREFECT_SERVER="ephemeral")),
        "shared": (flow_cmd, _env(PREFECT_HOME=str(home), MIMESIS_PREFECT_IDLE_S="600")),
    }, ROOT, repeat)
    subprocess.run([sys.executable, "-m", "flows.prefect_api", "stop", "--home", str(home)], cwd=ROOT,
                   env=_env(), capture_output=True)

    (work / "bench_noop_job.py").write_text(NOOP_JOB)
    job_env = _env(PYTHONPATH=f"{work}{os.pathsep}{ROOT}")

    def launcher_cmd(launcher: str) -> list[str]:
        cmd = build_command("midtrain", "params.yaml", 1, launcher, free_port())
        i = cmd.index("mimesis_lab.jobs.sft")
        return cmd[:i] + ["bench_noop_job"]               # the launcher's own arguments, a no-op module

    direct_env = {**job_env, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(free_port())}     # what launch.job_env gives a `direct` job
    launch = _interleaved({"deepspeed": (launcher_cmd("deepspeed"), job_env),
                           "torchrun": (launcher_cmd("torchrun"), job_env),
                           "direct": (launcher_cmd("direct"), direct_env)}, work, repeat)
    return {"flow_start": flows, "flow_start_ratio": flows["ephemeral"]["median_s"] / flows["shared"]["median_s"],
            "job_launch": launch,
            "job_launch_saving_s": launch["deepspeed"]["median_s"] - launch["torchrun"]["median_s"],
            "job_launch_direct_saving_s": launch["torchrun"]["median_s"] - launch["direct"]["median_s"]}


# ----------------------------------------------------------------------------- a whole run
#: Training stage -> the phases (jobs) it runs; the agent RL siblings share the stage `agent_rl`.
TRAINING = {"midtrain": ("midtrain",), "sft": ("sft",), "sim_rl": ("sim_rl",), "agent_sft": ("agent_sft",),
            "agent_rl": ("agent_grpo", "agent_csd")}
EPOCH = r"^(?:(\d+) )?"          # a timestamped log prefixes every line with the epoch second
STAGE_RE = re.compile(EPOCH + r"Running stage '([^']+)'")
WORK_RE = re.compile(EPOCH + r".* (\w+): done in [\d.]+s \(work ([\d.]+)s")
FLOW_BEGIN_RE = re.compile(EPOCH + r".*Beginning flow run")
FLOW_END_RE = re.compile(EPOCH + r".*Finished in state")
CLOCK_RE = re.compile(r"\b(\d\d):(\d\d):(\d\d)\.(\d{3}) \|")    # Prefect's own time of day in its log lines
TIMESTAMP_HOWTO = ("dvc repro -f 2>&1 | while IFS= read -r l; do printf '%s %s\\n' \"$(date +%s)\" \"$l\"; done "
                   "| tee repro.log")


class LogError(ValueError):
    """A ``--log`` the run analysis cannot use; the message says why and how to write a usable one."""


def _output_dir(project: Path, phase: str) -> Path:
    import yaml

    params = yaml.safe_load((project / "params.yaml").read_text())
    return project / params[phase]["output_dir"]


def _flow_time(m: re.Match, line: str) -> float | None:
    """The time of a Prefect flow line: its epoch prefix, else Prefect's time of day (seconds since midnight)."""
    if m.group(1):
        return float(m.group(1))
    c = CLOCK_RE.search(line)
    return None if c is None else int(c[1]) * 3600 + int(c[2]) * 60 + int(c[3]) + int(c[4]) / 1000


def _outputs_mtime(project: Path, stage: str, lock: dict) -> float | None:
    """When ``stage`` finished, by its outputs: the newest mtime of the files of its ``dvc.lock`` outs."""
    times = []
    for out in (lock.get("stages", {}).get(stage) or {}).get("outs", []):
        p = project / out["path"]
        files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()] if p.is_dir() else []
        times += [f.stat().st_mtime for f in files]
    return max(times) if times else None


def _job_work(project: Path, phase: str) -> float | None:
    """A training job's own wall time (its ``final`` record) plus the flow's evaluation of its final model."""
    metrics = _output_dir(project, phase) / "metrics.jsonl"
    final = [json.loads(x) for x in (metrics.read_text().splitlines() if metrics.is_file() else [])
             if '"kind": "final"' in x]
    if not final:
        return None
    summary = project / "metrics" / f"{phase}.json"
    extra = json.loads(summary.read_text()).get("final_eval_wall_time_s") or 0.0 if summary.is_file() else 0.0
    return final[-1]["wall_time_s"] + extra


def _side_by_side(project: Path, stage: str) -> bool:
    """Whether ``stage``'s jobs ran at once, by the training flow's own rule
    (:func:`flows.train.concurrent_siblings`)."""
    phases = TRAINING[stage]
    if len(phases) < 2:
        return False
    from flows.train import concurrent_siblings
    from mimesis_lab.config import load_params

    return bool(concurrent_siblings(load_params(project / "params.yaml"), list(phases)))


def analyse(log: Path, project: Path, mtimes: bool = False) -> dict:
    """Per stage wall time, work and overhead of the ``dvc repro`` whose output is ``log``. A timestamped log
    (every line prefixed with the epoch second, :data:`TIMESTAMP_HOWTO`) times each stage from its ``Running
    stage`` line to the next. A plain log raises :class:`LogError` (how to write a timestamped one), unless
    ``mtimes``: then the stages are timed by the mtimes of their outputs in ``project`` (``dvc.lock``), a stage
    ending when its newest output was written (before the stage's own tracking tail, so approximate; the first
    stage's wall time is unknown; outputs touched after the run make the order wrong, which raises). Raises
    :class:`LogError` too for a log with no stage in it."""
    lines = log.read_text(errors="replace").splitlines()
    stages: list[dict] = []
    for line in lines:
        if m := STAGE_RE.match(line):
            stages.append({"stage": m.group(2), "start": None if m.group(1) is None else int(m.group(1)),
                           "flow_begin": None, "flow_end": None, "work_s": None})
        elif stages:
            cur = stages[-1]
            if m := WORK_RE.match(line):
                cur["work_s"] = float(m.group(3))
            elif (m := FLOW_BEGIN_RE.match(line)) and cur["flow_begin"] is None:
                cur["flow_begin"] = _flow_time(m, line)
            elif m := FLOW_END_RE.match(line):
                cur["flow_end"] = _flow_time(m, line)
    if not stages:
        raise LogError(f"{log}: no `Running stage '…'` line: not the output of a `dvc repro` that ran stages "
                       f"(write one with: {TIMESTAMP_HOWTO})")
    timestamped = all(s["start"] is not None for s in stages)
    if not timestamped and not mtimes:
        raise LogError(f"{log}: the lines carry no epoch-second prefix, so the stages cannot be timed. Write a "
                       f"timestamped log: {TIMESTAMP_HOWTO}; or pass --mtimes to time this one (approximately) "
                       "by the mtimes of the stages' outputs in --project")
    if timestamped:
        stamps = [int(x.split()[0]) for x in lines if x.split() and x.split()[0].isdigit()]
        ends: list[float | None] = [s["start"] for s in stages[1:]] + [stamps[-1]]
        starts: list[float | None] = [s["start"] for s in stages]
    else:
        import yaml

        lock_file = project / "dvc.lock"
        lock = yaml.safe_load(lock_file.read_text()) if lock_file.is_file() else {}
        ends = [_outputs_mtime(project, s["stage"], lock) for s in stages]
        if all(e is None for e in ends):
            raise LogError(f"{log}: the lines carry no epoch-second prefix and the outputs of its stages are not in "
                           f"{project} (dvc.lock); pass --project, or write a timestamped log: {TIMESTAMP_HOWTO}")
        starts = [None] + ends[:-1]
        backwards = [s["stage"] for s, a, b in zip(stages, starts, ends) if a is not None and b is not None and b < a]
        if backwards:
            raise LogError(f"{log}: the outputs of {', '.join(backwards)} are older than those of the stage before: "
                           f"the mtimes in {project} are not those of this run (files touched since?); write a "
                           f"timestamped log: {TIMESTAMP_HOWTO}")
    rows = []
    for s, start, end in zip(stages, starts, ends):
        wall = None if start is None or end is None else end - start
        work = s["work_s"]
        if s["stage"] in TRAINING:
            works = [_job_work(project, phase) for phase in TRAINING[s["stage"]]]
            # side-by-side siblings (agent_rl.sibling_jobs: concurrent) take as long as the longer job
            work = None if None in works else (max(works) if _side_by_side(project, s["stage"]) else sum(works))
        elif s["stage"] == CODE_STAGE:
            work = 0.0        # writing the code fingerprints for DVC is orchestration: all of its wall time counts
        elif work is None and s["flow_begin"] is not None and s["flow_end"] is not None:
            work = (s["flow_end"] - s["flow_begin"]) % 86400      # a time of day may wrap at midnight
        rows.append({"stage": s["stage"], "wall_s": wall, "work_s": work,
                     "overhead_s": None if work is None or wall is None else max(0.0, wall - work)})
    known = [r for r in rows if r["wall_s"] is not None]
    total = sum(r["wall_s"] for r in known)
    over = sum(r["overhead_s"] or 0.0 for r in known)
    return {"timing": "log timestamps" if timestamped else "output mtimes (a plain log)",
            "stages": rows, "total_s": total, "overhead_s": over, "overhead_share": over / total if total else None,
            "stages_without_work_figure": [r["stage"] for r in rows if r["work_s"] is None],
            "stages_without_wall_time": [r["stage"] for r in rows if r["wall_s"] is None]}


def repro_in_clone() -> tuple[Path, Path]:
    project = Path(tempfile.mkdtemp(prefix="bench_overhead_run_")) / "project"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(project)], check=True)
    venv = ROOT / ".venv"
    if venv.exists():
        (project / ".venv").symlink_to(venv)
    log = project.parent / "repro.log"
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PREFECT_API_URL", None)
    with open(log, "w") as fh:
        proc = subprocess.Popen(["dvc", "repro", "-f"], cwd=project, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(f"{int(time.time())} {line}")
        if proc.wait() != 0:
            raise RuntimeError(f"dvc repro failed; log {log}")
    return log, project


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--pieces-only", action="store_true")
    ap.add_argument("--run-only", action="store_true")
    ap.add_argument("--log", type=Path, default=None, help="a timestamped dvc repro log (default: run one)")
    ap.add_argument("--project", type=Path, default=ROOT, help="the project the --log ran in")
    ap.add_argument("--mtimes", action="store_true", help="time a plain (not timestamped) --log by the mtimes of "
                    "the stages' outputs in --project (approximate)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out: dict = {}
    if not args.run_only:
        out["pieces"] = p = pieces(args.repeat)
        for name, res in (("flow start", p["flow_start"]), ("job launch", p["job_launch"])):
            for k, v in res.items():
                print(f"{name:10s} {k:10s} {v['median_s']:6.2f} s [{v['min_s']:.2f}–{v['max_s']:.2f}]")
        print(f"flow start: temporary server / shared server = {p['flow_start_ratio']:.2f}x; "
              f"job launch: deepspeed − torchrun = {p['job_launch_saving_s']:.1f} s, torchrun − direct = "
              f"{p['job_launch_direct_saving_s']:.1f} s per job")
    if not args.pieces_only:
        log, project = (args.log, args.project) if args.log else repro_in_clone()
        try:
            out["run"] = r = analyse(log, project, mtimes=args.mtimes)
        except (LogError, OSError) as e:
            print(f"bench_overhead: {e}", file=sys.stderr)
            return 2
        print(f"{'stage':14s} {'wall s':>7s} {'work s':>7s} {'overhead s':>10s}   (timing: {r['timing']})")
        for row in r["stages"]:
            wall = "-" if row["wall_s"] is None else f"{row['wall_s']:.0f}"
            work = "-" if row["work_s"] is None else f"{row['work_s']:.1f}"
            over = "-" if row["overhead_s"] is None else f"{row['overhead_s']:.1f}"
            print(f"{row['stage']:14s} {wall:>7s} {work:>7s} {over:>10s}")
        share = "-" if r["overhead_share"] is None else f"{100 * r['overhead_share']:.1f}%"
        print(f"total {r['total_s']:.0f} s, overhead {r['overhead_s']:.0f} s = {share}"
              + (f" (without {', '.join(r['stages_without_wall_time'])}: wall time unknown)"
                 if r["stages_without_wall_time"] else ""))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
