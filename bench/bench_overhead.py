"""Orchestration overhead: what a stage pays around its own work, piece by piece and over a whole run.

Two parts (both by default; ``--pieces-only`` / ``--run-only`` pick one):

1. **Pieces**, timed as subprocesses, variants interleaved (A, B, B, A, …) after one warm-up each,
   reported as median [min–max] seconds and the ratio of medians:

   - *flow start*: a Python process that runs one trivial Prefect flow, with Prefect's temporary server
     per flow run (``MIMESIS_PREFECT_SERVER=ephemeral``, what every flow did before) vs the shared server
     of :mod:`flows.prefect_api` (started by the warm-up, reused as in a ``dvc repro``);
   - *job launch*: a no-op distributed job (imports DeepSpeed, joins a gloo process group, exits)
     started with the ``deepspeed`` launcher vs ``torchrun`` (:func:`mimesis_lab.train.launch.build_command`),
     next to plain ``python`` running the same module.

2. **A whole run**: ``dvc repro -f`` of the project in a fresh clone (``--clone``, default) or a
   timestamped log of one (``--log FILE``, each line prefixed with the epoch second). Per stage: wall
   time (from ``Running stage`` to the next), the stage's own work (data stages: the ``work`` they log;
   training stages: the job's ``final.wall_time_s`` in ``models/<phase>/metrics.jsonl``; evaluation
   stages: the flow run's body, from ``Beginning flow run`` to ``Finished in state``), and overhead =
   wall − work; in total, the overhead share of the run.

    python bench/bench_overhead.py [--repeat 5] [--pieces-only | --run-only] [--log repro.log] [--out f.json]

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

    plain = [sys.executable, "-c", "import os; os.environ.update(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0', "
             f"MASTER_ADDR='127.0.0.1', MASTER_PORT='{free_port()}')\n" + NOOP_JOB]
    launch = _interleaved({"deepspeed": (launcher_cmd("deepspeed"), job_env),
                           "torchrun": (launcher_cmd("torchrun"), job_env),
                           "python": (plain, job_env)}, work, repeat)
    return {"flow_start": flows, "flow_start_ratio": flows["ephemeral"]["median_s"] / flows["shared"]["median_s"],
            "job_launch": launch,
            "job_launch_saving_s": launch["deepspeed"]["median_s"] - launch["torchrun"]["median_s"]}


# ----------------------------------------------------------------------------- a whole run
TRAINING = ("midtrain", "sft", "sim_rl", "agent_sft", "agent_grpo", "agent_csd")
STAGE_RE = re.compile(r"^(\d+) Running stage '([^']+)'")
WORK_RE = re.compile(r"^(\d+) .* (\w+): done in [\d.]+s \(work ([\d.]+)s")
FLOW_BEGIN_RE = re.compile(r"^(\d+) .*Beginning flow run")
FLOW_END_RE = re.compile(r"^(\d+) .*Finished in state")


def _output_dir(project: Path, phase: str) -> Path:
    import yaml

    params = yaml.safe_load((project / "params.yaml").read_text())
    return project / params[phase]["output_dir"]


def analyse(log: Path, project: Path) -> dict:
    lines = log.read_text(errors="replace").splitlines()
    stages: list[dict] = []
    for line in lines:
        if m := STAGE_RE.match(line):
            stages.append({"stage": m.group(2), "start": int(m.group(1)), "flow_begin": None, "flow_end": None,
                           "work_s": None})
        elif stages:
            cur = stages[-1]
            if m := WORK_RE.match(line):
                cur["work_s"] = float(m.group(3))
            elif (m := FLOW_BEGIN_RE.match(line)) and cur["flow_begin"] is None:
                cur["flow_begin"] = int(m.group(1))
            elif m := FLOW_END_RE.match(line):
                cur["flow_end"] = int(m.group(1))
    stamps = [int(x.split()[0]) for x in lines if x.split() and x.split()[0].isdigit()]
    ends = [s["start"] for s in stages[1:]] + [stamps[-1]]
    rows = []
    for s, end in zip(stages, ends):
        wall = end - s["start"]
        work = s["work_s"]
        if s["stage"] in TRAINING:
            final = [json.loads(x) for x in (_output_dir(project, s["stage"]) / "metrics.jsonl").read_text().splitlines()
                     if '"kind": "final"' in x]
            work = final[-1]["wall_time_s"] if final else None
        elif work is None and s["flow_begin"] and s["flow_end"]:
            work = s["flow_end"] - s["flow_begin"]
        rows.append({"stage": s["stage"], "wall_s": wall, "work_s": work,
                     "overhead_s": None if work is None else max(0.0, wall - work)})
    total = sum(r["wall_s"] for r in rows)
    over = sum(r["overhead_s"] or 0.0 for r in rows)
    return {"stages": rows, "total_s": total, "overhead_s": over, "overhead_share": over / total if total else None,
            "stages_without_work_figure": [r["stage"] for r in rows if r["work_s"] is None]}


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
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out: dict = {}
    if not args.run_only:
        out["pieces"] = p = pieces(args.repeat)
        for name, res in (("flow start", p["flow_start"]), ("job launch", p["job_launch"])):
            for k, v in res.items():
                print(f"{name:10s} {k:10s} {v['median_s']:6.2f} s [{v['min_s']:.2f}–{v['max_s']:.2f}]")
        print(f"flow start: temporary server / shared server = {p['flow_start_ratio']:.2f}x; "
              f"job launch: deepspeed − torchrun = {p['job_launch_saving_s']:.1f} s per job")
    if not args.pieces_only:
        log, project = (args.log, args.project) if args.log else repro_in_clone()
        out["run"] = r = analyse(log, project)
        print(f"{'stage':14s} {'wall s':>7s} {'work s':>7s} {'overhead s':>10s}")
        for row in r["stages"]:
            work = "-" if row["work_s"] is None else f"{row['work_s']:.1f}"
            over = "-" if row["overhead_s"] is None else f"{row['overhead_s']:.1f}"
            print(f"{row['stage']:14s} {row['wall_s']:7.0f} {work:>7s} {over:>10s}")
        print(f"total {r['total_s']:.0f} s, overhead {r['overhead_s']:.0f} s = {100 * r['overhead_share']:.1f}%")
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
