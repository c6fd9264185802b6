"""Benchmark (not a test): throughput of the ``role_swap`` + ``thoughttrace`` stages.

Scales the bundled fixtures up to N conversations per dataset (default 100,000, unique
ids), then runs, each in a fresh subprocess so peak RSS is its own:

- ``vectorised``: the real stage code (msgspec per-line validation + polars transforms
  + parquet write), i.e. ``stages.role_swap.run_role_swap`` / ``stages.thoughttrace``;
- ``per_row``: a per-row pure-Python implementation of the same work (``json.loads``,
  hand-written field checks, :func:`mimesis_lab.chat.role_swap` /
  :func:`mimesis_lab.thoughttrace.format_conversation`, list of dicts -> parquet),
  measured in the same run as the baseline.

Reports rows/s, the speed-up ratio and peak RSS, to stdout and
``bench/results/data_stages.json``. Usage::

    python bench/bench_data_stages.py [--n 100000] [--repeat 1]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
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


IMPLS = {
    ("per_row", "role_swap"): _per_row_role_swap,
    ("per_row", "thoughttrace"): _per_row_thoughttrace,
    ("vectorised", "role_swap"): _vectorised_role_swap,
    ("vectorised", "thoughttrace"): _vectorised_thoughttrace,
}


def _child(impl: str, stage: str, path: str, out: str) -> None:
    import msgspec  # noqa: F401  (import cost is not part of the measured work)
    import polars  # noqa: F401

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000, help="conversations per dataset")
    ap.add_argument("--repeat", type=int, default=1, help="runs per implementation (best time kept)")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        files = scale_up(args.n, tmp)
        sizes = {k: round(p.stat().st_size / 2**20, 1) for k, p in files.items()}
        results: dict = {"n": args.n, "input_mb": sizes, "cpus": os.cpu_count(), "stages": {}}
        for stage, key in (("role_swap", "chats"), ("thoughttrace", "thoughttrace")):
            entry = {}
            for impl in ("per_row", "vectorised"):
                runs = [measure(impl, stage, files[key], tmp) for _ in range(args.repeat)]
                best = min(runs, key=lambda r: r["seconds"])
                best["rows_per_s"] = best["rows"] / best["seconds"]
                entry[impl] = best
            assert entry["per_row"]["rows"] == entry["vectorised"]["rows"], entry
            entry["speedup"] = entry["vectorised"]["rows_per_s"] / entry["per_row"]["rows_per_s"]
            entry["rss_ratio"] = entry["vectorised"]["peak_rss_mb"] / entry["per_row"]["peak_rss_mb"]
            results["stages"][stage] = entry
        tot = {impl: sum(results["stages"][s][impl]["seconds"] for s in results["stages"])
               for impl in ("per_row", "vectorised")}
        results["combined_speedup"] = tot["per_row"] / tot["vectorised"]
    out = ROOT / "bench" / "results" / "data_stages.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"n={args.n} conversations per dataset, input MB {sizes}, {results['cpus']} CPUs")
    for stage, e in results["stages"].items():
        print(f"{stage:13s} per_row {e['per_row']['rows_per_s']:9.0f} rows/s "
              f"(peak {e['per_row']['peak_rss_mb']:.0f} MB) | vectorised {e['vectorised']['rows_per_s']:9.0f} rows/s "
              f"(peak {e['vectorised']['peak_rss_mb']:.0f} MB) | speed-up x{e['speedup']:.2f}, RSS ratio {e['rss_ratio']:.2f}")
    print(f"combined role_swap+thoughttrace speed-up x{results['combined_speedup']:.2f} -> {out}")


if __name__ == "__main__":
    main()
