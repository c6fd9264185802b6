"""glibc malloc settings of the jobs (mimesis_lab/train/alloc.py): the same short jobs with them and without.

Each phase's job (``sft``: ``--sft-steps`` optimizer steps; ``agent_grpo``: ``--rl-steps`` RL steps against
the ``sim_rl`` simulator) runs as the training flow launches it (:func:`mimesis_lab.train.launch.launch`,
``direct``, tracking off, outputs in a temporary folder), ``on`` (the default job environment) and ``off``
(``MIMESIS_MALLOC_TUNING=0``: glibc's defaults), interleaved (on, off, off, on, …) after one warm-up of each.
Per variant: the job's wall time (``final.wall_time_s`` of its ``metrics.jsonl``), its training-steps time
(``phases_s.steps`` where the job reports it), CPU seconds in user and kernel mode and minor page faults of the
job process; the ratio off / on of the medians; and whether both gave the same final weights (sha256).

    python bench/bench_malloc.py [--repeat 3] [--phases sft agent_grpo] [--sft-steps 40] [--rl-steps 6]

Needs the models and splits of a ``dvc repro`` (``models/midtrain``, ``models/sim_rl``, ``models/agent_sft``).
Not a test: run on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mimesis_lab.train.alloc import MALLOC_ENV, SWITCH_ENV  # noqa: E402
from mimesis_lab.train.launch import launch  # noqa: E402

VARIANTS = ("on", "off")


def _params(base: dict, phase: str, out: Path, sft_steps: int, rl_steps: int) -> dict:
    p = copy.deepcopy(base)
    p.setdefault("tracking", {})["enabled"] = False
    if phase == "sft":
        p["sft"].update(max_steps=sft_steps, output_dir=str(out), token_cache=False)
    else:
        p["agent_rl"]["steps"] = rl_steps
        p[phase]["output_dir"] = str(out)
    return p


def _run(phase: str, base: dict, variant: str, work: Path, args: argparse.Namespace) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"{phase}_{variant}_", dir=work))
    params_path = out / "params.yaml"
    params_path.write_text(yaml.safe_dump(_params(base, phase, out / "run", args.sft_steps, args.rl_steps)))
    env = {k: v for k, v in os.environ.items() if k not in (*MALLOC_ENV, SWITCH_ENV)}
    env[SWITCH_ENV] = "1" if variant == "on" else "0"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    launch(phase, str(params_path), 1, "direct", env, cwd=ROOT, log_path=out / "job.log", echo=False)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    final = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()
             if '"final"' in line][-1]
    weights = hashlib.sha256((out / "run" / "final" / "model.safetensors").read_bytes()).hexdigest()
    return {"process_s": wall, "job_s": final["wall_time_s"], "steps_s": (final.get("phases_s") or {}).get("steps"),
            "user_s": after.ru_utime - before.ru_utime, "sys_s": after.ru_stime - before.ru_stime,
            "minor_faults": after.ru_minflt - before.ru_minflt, "weights": weights}


def bench_phase(phase: str, base: dict, work: Path, args: argparse.Namespace) -> dict:
    for v in VARIANTS:                                    # warm-up: file cache, compiled kernels
        _run(phase, base, v, work, args)
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for r in range(args.repeat):
        for v in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
            runs[v].append(_run(phase, base, v, work, args))
    res: dict = {"runs": runs, "median": {}}
    for v in VARIANTS:
        res["median"][v] = {k: statistics.median(x[k] for x in runs[v])
                            for k in ("process_s", "job_s", "steps_s", "user_s", "sys_s", "minor_faults")
                            if all(x[k] is not None for x in runs[v])}
    res["off_over_on"] = {k: round(res["median"]["off"][k] / res["median"]["on"][k], 3)
                          for k in res["median"]["on"] if res["median"]["on"][k]}
    res["same_weights"] = len({x["weights"] for v in VARIANTS for x in runs[v]}) == 1
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--phases", nargs="+", default=["sft", "agent_grpo"], choices=["sft", "agent_grpo"])
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--sft-steps", type=int, default=40)
    ap.add_argument("--rl-steps", type=int, default=6)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/malloc.json")
    args = ap.parse_args(argv)
    os.chdir(ROOT)                                          # params paths are relative to the project root
    base = yaml.safe_load(args.params.read_text())
    res = {"repeat": args.repeat, "settings": MALLOC_ENV, "phases": {},
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}}
    with tempfile.TemporaryDirectory(prefix="bench_malloc_") as tmp:
        for phase in args.phases:
            r = res["phases"][phase] = bench_phase(phase, base, Path(tmp), args)
            print(f"{phase}: median of {args.repeat} (off / on), same weights: {r['same_weights']}")
            for k, ratio in r["off_over_on"].items():
                print(f"  {k:13s} on {r['median']['on'][k]:>12.2f}  off {r['median']['off'][k]:>12.2f}  "
                      f"off/on {ratio:.3f}")
    res["machine"]["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
