"""Benchmark (not a test): throughput of the ``role_swap`` + ``thoughttrace`` stages, against a per-row
baseline and against the raw JSON read of the same bytes.

Scales the bundled fixtures up to N conversations per dataset (default 100,000, unique
ids), then runs, each in a fresh subprocess so peak RSS is its own:

- ``vectorised``: the real stage code (msgspec per-line validation + polars transforms
  + parquet write), i.e. ``stages.role_swap.run_role_swap`` / ``stages.thoughttrace``;
- ``per_row``: a per-row pure-Python implementation of the same work (``json.loads``,
  hand-written field checks, :func:`mimesis_lab.chat.role_swap` /
  :func:`mimesis_lab.thoughttrace.format_conversation`, list of dicts -> parquet), the baseline;
- ``arrow_read`` / ``polars_read``: only reading the same input file into a table, with
  ``pyarrow.json.read_json`` (schema inferred, blocks as large as the longest line needs) and
  ``polars.read_ndjson``: no checks, no transform, no write. The faster of the two in each repeat is
  the *raw read* of the file on this machine; a stage's throughput is reported as a share of it
  (raw-read seconds / stage seconds for the same bytes; target >= 50%);
- ``schema_read``: ``pyarrow.json.read_json`` with the stage's own explicit Arrow schema (fields the stage
  does not use are skipped, as the stage's reader does): the read the stage cannot avoid, so its share of
  this one is the stage's efficiency net of reading. A stage can beat the raw read (share > 1) this way.

Every repeat runs every variant of both stages once, in a rotated order (interleaved); each reports
median [min–max] over ``--repeat`` runs of rows/s, MB/s of input and peak RSS, and the ratios are paired
per repeat (``speedup`` = per-row seconds / vectorised seconds, ``share_of_raw_read`` = raw-read seconds
/ vectorised seconds, ``share_of_schema_read`` likewise). Import time is not measured (each child imports
polars, pyarrow, msgspec and the stage modules first). Prints and writes ``bench/results/data_stages.json``.
Usage::

    python bench/bench_data_stages.py [--n 100000] [--repeat 3]

On a shared machine every figure is noisy: read the spread.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def scale_up(n: int, out: Path) -> dict[str, Path]:
    """Write N chat and N ThoughtTrace conversations made unique from the fixtures."""
    chats = [line for p in sorted((ROOT / "data/raw/chats").glob("*.jsonl"))
             for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    tts = [line for line in (ROOT / "data/raw/thoughttrace/thoughttrace.jsonl").read_text(
        encoding="utf-8").splitlines() if line.strip()]
    chat_path, tt_path = out / "chats.jsonl", out / "thoughttrace.jsonl"
    with open(chat_path, "w", encoding="utf-8") as f:
        for i in range(n):
            rec = json.loads(chats[i % len(chats)])
            rec["conversation_hash"] = f"{i:032x}"
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    with open(tt_path, "w", encoding="utf-8") as f:
        for i in range(n):
            rec = json.loads(tts[i % len(tts)])
            rec["id"] = f"user{i // 3}_task{i % 3}_conversation{i}"
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return {"chats": chat_path, "thoughttrace": tt_path}


# ---------------------------------------------------------------- per-row baseline
def _per_row_role_swap(path: Path, out: Path) -> int:
    import polars as pl

    from mimesis_lab.chat import role_swap

    rows, seen = [], set()
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                continue
            conv = rec.get("conversation") if isinstance(rec, dict) else None
            if not isinstance(rec.get("conversation_hash"), str) or not isinstance(conv, list) or not conv:
                continue
            if not all(isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
                       and isinstance(m.get("content"), str) and len(m["content"]) <= 32000 for m in conv):
                continue
            uid = rec.get("hashed_ip") or next((m.get("hashed_ip") for m in conv
                                                 if m["role"] == "user" and m.get("hashed_ip")), None)
            if uid is None or rec["conversation_hash"] in seen:
                continue
            seen.add(rec["conversation_hash"])
            msgs = role_swap([{"role": m["role"], "content": m["content"]} for m in conv], swap=True)
            rows.append({"conversation_id": rec["conversation_hash"], "user_id": uid, "source": path.stem,
                         "source_file": str(path), "row": lineno, "swap": True, "copies": 1,
                         "messages": msgs, "n_messages": len(msgs),
                         "n_target_turns": sum(m["role"] == "assistant" for m in msgs),
                         "model": rec.get("model"), "language": rec.get("language")})
    pl.DataFrame(rows).write_parquet(out)
    return len(rows)


def _per_row_thoughttrace(path: Path, out: Path) -> int:
    import re

    import polars as pl

    from mimesis_lab.thoughttrace import build_system_prompt, format_conversation, is_alternating

    pat = re.compile(r"^(user[^_]+)_(task[^_]+)_(conversation[^_]+)$")
    rows, seen = [], set()
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                continue
            msgs = rec.get("messages") if isinstance(rec, dict) else None
            m = pat.match(rec.get("id") or "") if isinstance(rec.get("id"), str) else None
            if m is None or not isinstance(rec.get("task_summary"), str) or not isinstance(msgs, list) or not msgs:
                continue
            if not all(isinstance(x, dict) and x.get("type") in ("user", "assistant")
                       and isinstance(x.get("content"), str) and len(x["content"]) <= 32000 for x in msgs):
                continue
            if rec["id"] in seen or not is_alternating([x["type"] for x in msgs])[0]:
                continue
            seen.add(rec["id"])
            chat = format_conversation(rec)
            turns = [{"role": x["type"], "content": x["content"],
                      "reasons": [r["content"].strip() for r in x.get("reasons") or [] if r["content"].strip()],
                      "reactions": [r["content"].strip() for r in x.get("reactions") or [] if r["content"].strip()]}
                     for x in msgs]
            rows.append({"conversation_id": rec["id"], "user_id": m.group(1), "task_id": m.group(2),
                         "model_name": rec.get("model_name"), "source_file": str(path), "row": lineno,
                         "system_prompt": build_system_prompt(rec.get("task_summary"), rec.get("task_expectation"),
                                                              (rec.get("survey_answers") or [None])[0]),
                         "messages": chat, "turns": turns, "n_messages": len(chat),
                         "n_target_turns": sum(x["type"] == "user" for x in msgs),
                         "n_turns_without_reasons": sum(x["type"] == "user" and not t["reasons"]
                                                        for x, t in zip(msgs, turns)),
                         "include_reactions": False})
    pl.DataFrame(rows).write_parquet(out)
    return len(rows)


# ---------------------------------------------------------------- vectorised (the stages)
def _vectorised_role_swap(path: Path, out: Path) -> int:
    from mimesis_lab.config import RoleSwapParams
    from stages.common import write_output
    from stages.role_swap import run_role_swap

    cfg = RoleSwapParams(mixture={str(path): 1.0}, output=str(out))
    r = run_role_swap(cfg)
    write_output(out, r.outputs[cfg.output])
    r.close()
    return r.rows_out


def _vectorised_thoughttrace(path: Path, out: Path) -> int:
    from mimesis_lab.config import ThoughtTraceParams
    from stages.common import write_output
    from stages.thoughttrace import run_thoughttrace

    cfg = ThoughtTraceParams(input=str(path), output=str(out))
    r = run_thoughttrace(cfg)
    write_output(out, r.outputs[cfg.output])
    r.close()
    return r.rows_out


# ---------------------------------------------------------------- raw reads (the limit)
def _longest_line(path: Path) -> int:
    with open(path, "rb") as f:
        return max((len(line) for line in f), default=0)


def _arrow_read(path: Path, out: Path) -> int:
    import pyarrow.json as pa_json

    opts = pa_json.ReadOptions(block_size=max(4 << 20, 2 * _longest_line(path) + 1))
    return pa_json.read_json(path, read_options=opts).num_rows


def _polars_read(path: Path, out: Path) -> int:
    import polars as pl

    return pl.read_ndjson(path).height


def _schema_read(schema):
    """The stage's own Arrow read of ``path`` (its explicit schema, other fields skipped)."""
    def read(path: Path, out: Path) -> int:
        import pyarrow.json as pa_json

        opts = pa_json.ReadOptions(block_size=max(4 << 20, 2 * _longest_line(path) + 1))
        parse = pa_json.ParseOptions(explicit_schema=schema(), unexpected_field_behavior="ignore")
        return pa_json.read_json(path, read_options=opts, parse_options=parse).num_rows
    return read


def _role_swap_schema():
    from stages.role_swap import ARROW_SCHEMA

    return ARROW_SCHEMA


def _thoughttrace_schema():
    from stages.thoughttrace import ARROW_SCHEMA

    return ARROW_SCHEMA


IMPLS = {
    ("per_row", "role_swap"): _per_row_role_swap,
    ("per_row", "thoughttrace"): _per_row_thoughttrace,
    ("vectorised", "role_swap"): _vectorised_role_swap,
    ("vectorised", "thoughttrace"): _vectorised_thoughttrace,
    ("arrow_read", "role_swap"): _arrow_read,
    ("arrow_read", "thoughttrace"): _arrow_read,
    ("polars_read", "role_swap"): _polars_read,
    ("polars_read", "thoughttrace"): _polars_read,
    ("schema_read", "role_swap"): _schema_read(_role_swap_schema),
    ("schema_read", "thoughttrace"): _schema_read(_thoughttrace_schema),
}
VARIANTS = ("per_row", "vectorised", "arrow_read", "polars_read", "schema_read")
STAGES = (("role_swap", "chats"), ("thoughttrace", "thoughttrace"))


def _child(impl: str, stage: str, path: str, out: str) -> None:
    import msgspec  # noqa: F401  (import cost is not part of the measured work)
    import polars  # noqa: F401
    import pyarrow.json  # noqa: F401

    import mimesis_lab.chat  # noqa: F401
    import mimesis_lab.thoughttrace  # noqa: F401
    import stages.common  # noqa: F401
    import stages.role_swap  # noqa: F401
    import stages.thoughttrace  # noqa: F401

    fn = IMPLS[(impl, stage)]
    t0 = time.perf_counter()
    rows = fn(Path(path), Path(out))
    dt = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"rows": rows, "seconds": dt, "peak_rss_mb": peak_kb / 1024}))


def measure(impl: str, stage: str, path: Path, tmp: Path) -> dict:
    out = tmp / f"{impl}_{stage}.parquet"
    res = subprocess.run([sys.executable, __file__, "--child", impl, stage, str(path), str(out)],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def rotated(items: tuple[str, ...], r: int) -> list[str]:
    """``items`` starting at position ``r`` (mod len), reversed on odd repeats: each variant leads and
    trails in turn."""
    k = r % len(items)
    out = list(items[k:] + items[:k])
    return out[::-1] if r % 2 else out


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def fmt(d: dict[str, float], nd: int = 2, unit: str = "") -> str:
    return f"{d['median']:.{nd}f}{unit} [{d['min']:.{nd}f}-{d['max']:.{nd}f}]"


def stage_report(runs: dict[str, list[dict]], mb: float) -> dict:
    """Per variant: rows/s, MB/s and peak RSS (median [min-max]); paired ratios per repeat."""
    raw = [min(a["seconds"], p["seconds"]) for a, p in zip(runs["arrow_read"], runs["polars_read"])]
    vec, per_row = ([r["seconds"] for r in runs[v]] for v in ("vectorised", "per_row"))
    out = {v: {"rows": runs[v][0]["rows"], "rows_per_s": summary([r["rows"] / r["seconds"] for r in runs[v]]),
               "mb_per_s": summary([mb / r["seconds"] for r in runs[v]]),
               "peak_rss_mb": summary([r["peak_rss_mb"] for r in runs[v]]), "seconds": [r["seconds"] for r in runs[v]]}
           for v in VARIANTS}
    out["raw_read_mb_per_s"] = summary([mb / t for t in raw])
    out["speedup"] = summary([b / a for a, b in zip(vec, per_row)])
    out["share_of_raw_read"] = summary([t / a for a, t in zip(vec, raw)])
    out["share_of_schema_read"] = summary([r["seconds"] / a for a, r in zip(vec, runs["schema_read"])])
    out["per_row_share_of_raw_read"] = summary([t / b for b, t in zip(per_row, raw)])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000, help="conversations per dataset")
    ap.add_argument("--repeat", type=int, default=3, help="runs of every variant, interleaved")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        files = scale_up(args.n, tmp)
        sizes = {k: p.stat().st_size / 2**20 for k, p in files.items()}
        runs = {stage: {v: [] for v in VARIANTS} for stage, _ in STAGES}
        for r in range(args.repeat):
            for stage, key in STAGES:
                for v in rotated(VARIANTS, r):
                    runs[stage][v].append(measure(v, stage, files[key], tmp))
        results: dict = {"command": "python bench/bench_data_stages.py " + " ".join(sys.argv[1:]), "n": args.n,
                         "repeat": args.repeat, "order": "interleaved, rotated per repeat",
                         "input_mb": {k: round(v, 1) for k, v in sizes.items()}, "cpus": os.cpu_count(),
                         "load_avg_1m": os.getloadavg()[0], "stages": {}}
        for stage, key in STAGES:
            rows = {v: runs[stage][v][0]["rows"] for v in ("per_row", "vectorised")}
            assert rows["per_row"] == rows["vectorised"], (stage, rows)
            results["stages"][stage] = stage_report(runs[stage], sizes[key])
        both = {v: [sum(runs[s][v][i]["seconds"] for s, _ in STAGES) for i in range(args.repeat)] for v in VARIANTS}
        raw = [min(a, p) for a, p in zip(both["arrow_read"], both["polars_read"])]
        results["combined"] = {"speedup": summary([b / a for a, b in zip(both["vectorised"], both["per_row"])]),
                               "share_of_raw_read": summary([t / a for a, t in zip(both["vectorised"], raw)]),
                               "share_of_schema_read": summary([t / a for a, t in zip(both["vectorised"],
                                                                                       both["schema_read"])])}
    out = ROOT / "bench" / "results" / "data_stages.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"n={args.n} conversations per dataset, input MB {results['input_mb']}, {results['cpus']} CPUs, "
          f"{args.repeat} interleaved repeats, median [min-max] (1-min load average {results['load_avg_1m']:.1f})")
    for stage, e in results["stages"].items():
        print(f"{stage}: {e['vectorised']['rows']} rows; raw read {fmt(e['raw_read_mb_per_s'], 1, ' MB/s')}")
        for v in VARIANTS:
            print(f"  {v:12s} {fmt(e[v]['rows_per_s'], 0, ' rows/s'):>32} {fmt(e[v]['mb_per_s'], 1, ' MB/s'):>26} "
                  f"peak {e[v]['peak_rss_mb']['median']:.0f} MB")
        print(f"  vectorised / per_row x{fmt(e['speedup'])}; share of the raw read: vectorised "
              f"{fmt(e['share_of_raw_read'])}, per_row {fmt(e['per_row_share_of_raw_read'])}; vectorised share of "
              f"the schema read {fmt(e['share_of_schema_read'])}")
    c = results["combined"]
    print(f"combined role_swap+thoughttrace: vectorised / per_row x{fmt(c['speedup'])}, "
          f"share of the raw read {fmt(c['share_of_raw_read'])}, of the schema read "
          f"{fmt(c['share_of_schema_read'])} -> {out}")


if __name__ == "__main__":
    main()
