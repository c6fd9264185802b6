"""Benchmark (not a test): the pre-tokenised cache of the SFT-style jobs (``sft_run.token_cache``).

What the job spends to get its token rows (train + val split, as :func:`mimesis_lab.train.token_cache.load_split_rows`
gets them in ``mimesis_lab/jobs/sft.py``), for the ``midtrain`` data (role-swapped chats, mixture-expanded) and the
``sft`` data (ThoughtTrace), with the settings of ``params.yaml`` (``max_len``, ``overlong``, ``train_role``, the
batching mode resolved for this device unless ``--batching``) and the tokenizer folder of the ``tokenizer`` stage:

- ``none``: the cache off, the splits read and tokenised (the job before the cache);
- ``cold``: an empty cache: the key (sha256 of the tokenizer files, the split files, the settings and the code),
  read and tokenise, then write the cache (a job's first run);
- ``warm``: the key and the cached rows read back (every later run; the other ranks of a world-size > 1 job).

Each run starts as a job's data phase does: a freshly loaded tokenizer (the BPE's word cache empty, as in a new
process) and the source files parsed by the run fingerprint only (the key's code identity reuses them). The
tokenizer load is the same in every variant: the figures leave it out, and give the speed-up of the warm cache
with it too (the job's whole ``data`` phase). The variants are
interleaved (each repeat runs all of them, in a rotated order); each reports median [min–max] seconds over
``--repeat``, and the speed-ups ``none / warm`` and ``none / cold`` are paired per repeat. Every variant's rows
are checked equal to the uncached ones. Prints and writes ``bench/results/token_cache.json``. Needs the data of
``dvc repro tokenizer`` (the split parquets and ``models/tokenizer``). Usage::

    OMP_NUM_THREADS=1 python bench/bench_token_cache.py [--repeat 5] [--phases midtrain sft] [--batching grouped]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

VARIANTS = ("none", "cold", "warm")


def _summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def _fmt(s: dict[str, float], digits: int = 3, unit: str = "") -> str:
    return f"{s['median']:.{digits}f}{unit} [{s['min']:.{digits}f}–{s['max']:.{digits}f}]"


def bench_phase(phase: str, params, tokenizer_dir: Path, batching: str, repeat: int, work: Path) -> dict:
    from mimesis_lab import code_deps
    from mimesis_lab.tokenizer import load_tokenizer
    from mimesis_lab.train.token_cache import CACHE_DIR, load_split_rows

    cfg = getattr(params, phase)
    splits = {"train": (cfg.train, True), "val": (cfg.val, False)}
    dirs = {v: work / phase / v / CACHE_DIR for v in VARIANTS}

    def run(variant: str, check: bool = True):
        code_deps._closure.cache_clear()                   # a new process: no source file parsed yet ...
        code_deps._parsed_imports.cache_clear()
        code_deps.code_identity("mimesis_lab.jobs.sft")    # ... but the job's fingerprint before its data
        if variant == "cold":
            shutil.rmtree(dirs["cold"], ignore_errors=True)
        t_tok = time.perf_counter()
        tokenizer = load_tokenizer(tokenizer_dir)          # a new Rust tokenizer: empty BPE cache
        t0 = time.perf_counter()
        rows, status = load_split_rows(splits, tokenizer, tokenizer_dir, cfg, batching=batching,
                                       cache_dir=dirs[variant], enabled=variant != "none")
        t1 = time.perf_counter()
        want = {"none": "off", "cold": "missing", "warm": "hit"}[variant]
        assert not check or set(status.values()) == {want}, (variant, status)
        return rows, t1 - t0, t1 - t_tok

    reference = run("none")[0]
    run("warm", check=False)                               # fill the warm cache once
    seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with_tokenizer: dict[str, list[float]] = {v: [] for v in VARIANTS}     # the job's whole `data` phase
    for i in range(repeat):
        order = VARIANTS[i % 3:] + VARIANTS[:i % 3]
        for v in order:
            rows, dt, dt_all = run(v)
            assert rows == reference, f"{phase}/{v}: rows differ from the uncached ones"
            seconds[v].append(dt)
            with_tokenizer[v].append(dt_all)
    train_rows, train_stats = reference["train"]
    cache_bytes = sum(p.stat().st_size for p in dirs["warm"].glob("*.parquet"))
    return {
        "train": str(cfg.train), "val": str(cfg.val), "batching": batching, "max_len": cfg.max_len,
        "conversations": {k: s["conversations"] for k, (_, s) in reference.items()},
        "rows": {k: len(r) for k, (r, _) in reference.items()},
        "tokens": {k: s["real_tokens"] for k, (_, s) in reference.items()},
        "cache_mb": round(cache_bytes / 1e6, 3),
        "seconds": {v: _summary(xs) for v, xs in seconds.items()},
        "speedup_warm": _summary([n / w for n, w in zip(seconds["none"], seconds["warm"])]),
        "speedup_cold": _summary([n / c for n, c in zip(seconds["none"], seconds["cold"])]),
        "seconds_with_tokenizer_load": {v: _summary(xs) for v, xs in with_tokenizer.items()},
        "speedup_warm_with_tokenizer_load": _summary([n / w for n, w in zip(with_tokenizer["none"],
                                                                             with_tokenizer["warm"])]),
        "raw_seconds": seconds,
        "examples_in_train": train_stats["examples_in"], "train_rows": len(train_rows),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--phases", nargs="+", default=["midtrain", "sft"], choices=["midtrain", "sft", "agent_sft"])
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--tokenizer", type=Path, default=None, help="tokenizer folder (default: tokenizer.output_dir)")
    ap.add_argument("--batching", default=None, help="batching mode (default: the phase's, resolved for the device)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/token_cache.json")
    args = ap.parse_args(argv)

    import torch

    from mimesis_lab.config import load_params
    from mimesis_lab.train.data import resolve_batching

    os.chdir(ROOT)                                          # params paths are relative to the project root
    params = load_params(args.params)
    tokenizer_dir = args.tokenizer or Path(params.tokenizer.pretrained or params.tokenizer.output_dir)
    missing = [p for ph in args.phases for p in (getattr(params, ph).train, getattr(params, ph).val)
               if not Path(p).is_file()] + ([] if tokenizer_dir.is_dir() else [str(tokenizer_dir)])
    if missing:
        sys.exit(f"missing {missing}: run `dvc repro tokenizer` first (and `dvc repro agent_traces` for agent_sft)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    res = {"repeat": args.repeat, "tokenizer": str(tokenizer_dir), "phases": {},
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                       "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}}
    with tempfile.TemporaryDirectory(prefix="bench_token_cache_") as tmp:
        for phase in args.phases:
            batching = resolve_batching(args.batching or getattr(params, phase).batching, device)
            r = res["phases"][phase] = bench_phase(phase, params, tokenizer_dir, batching, args.repeat, Path(tmp))
            print(f"{phase} ({r['conversations']['train']} + {r['conversations']['val']} conversations, "
                  f"{r['tokens']['train'] + r['tokens']['val']} tokens, {batching}, cache {r['cache_mb']} MB):")
            for v in VARIANTS:
                print(f"  {v:5s} {_fmt(r['seconds'][v], unit=' s')}")
            print(f"  warm: {_fmt(r['speedup_warm'], 2, '×')} faster than no cache; "
                  f"cold: {_fmt(r['speedup_cold'], 2, '×')}")
            t = r["seconds_with_tokenizer_load"]
            print(f"  with the tokenizer load (the job's whole data phase): none {_fmt(t['none'], unit=' s')}, "
                  f"warm {_fmt(t['warm'], unit=' s')}, {_fmt(r['speedup_warm_with_tokenizer_load'], 2, '×')}")
    res["machine"]["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
