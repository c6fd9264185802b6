"""DVC stage ``validate``: great-expectations suites over every data-stage output.

``python -m stages.validate [--params params.yaml] [--no-track]``

One suite per output (``role_swap``, ``thoughttrace``, ``behavior_annotations``,
``behavior_frequencies``, ``behavior_tasks``), per split file (``splits/<dataset>/<split>``),
per agent-gym split file (``gyms/<split>``), per quarantine file (``quarantine/<stage>``) and
per stage metrics file (``metrics/<stage>``);
``role_swap`` and ``thoughttrace`` also get ``<name>.messages`` over their flattened messages.
The suites are specified in :mod:`mimesis_lab.expectations`. Each file is read with polars,
the derived invariant columns are added there, and the frame is converted to pandas once.
All suites run on one ephemeral great-expectations context per process.

Writes ``metrics/validate.json`` (``validate.report``), prints one line per failed
expectation (suite, expectation, column, unexpected values, example rows) and exits 1 when
any expectation fails and ``validate.fail_on_error`` is set (2 on a params error).
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import polars as pl  # noqa: E402

from mimesis_lab import expectations as X  # noqa: E402
from mimesis_lab.config import ConfigError, Params, flatten, load_params  # noqa: E402
from stages.common import metrics_path, quarantine_path  # noqa: E402

log = logging.getLogger("mimesis.stages")

STAGE = "validate"
DATA_STAGES = ("role_swap", "thoughttrace", "behaviors", "behavior_tasks", "splits", "gyms")
OUTPUT_ROWS_STAGES = ("role_swap", "thoughttrace")  # stages whose rows_out is their one output's row count
N_UNEXPECTED = 5       # unexpected values / example rows kept per failure
MAX_CHARS = 200        # long values (raw records, contents) are cut in the report
RESULT_FORMAT = {"result_format": "SUMMARY", "partial_unexpected_count": N_UNEXPECTED}


# --- great-expectations: one ephemeral context per process ------------------------------------

class Runner:
    """An ephemeral context with one pandas dataframe asset, reused for every suite."""

    def __init__(self) -> None:
        import great_expectations as gx
        from great_expectations.data_context.types.base import (
            DataContextConfig, InMemoryStoreBackendDefaults, ProgressBarsConfig,
        )

        config = DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(),
            progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
            analytics_enabled=False,
        )
        self.context = gx.get_context(mode="ephemeral", project_config=config)
        asset = self.context.data_sources.add_pandas(name="mimesis").add_dataframe_asset(name="frame")
        self.batch_definition = asset.add_batch_definition_whole_dataframe("whole")

    def validate(self, suite, frame):
        batch = self.batch_definition.get_batch(batch_parameters={"dataframe": frame})
        return batch.validate(suite, result_format=RESULT_FORMAT)


@lru_cache(maxsize=1)
def get_runner() -> Runner:
    return Runner()


# --- targets ------------------------------------------------------------------------------------

@dataclass
class Target:
    spec: X.Spec
    path: Path
    env: Callable[[], dict[str, Any]] = dict   # cross-file inputs, computed only when the suite runs
    required: bool = True
    frame: Callable[[], pl.DataFrame] | None = None   # built in memory (metrics) instead of read from path


def output_paths(params: Params) -> dict[str, str]:
    b = params.behaviors
    return {
        "role_swap": params.role_swap.output,
        "thoughttrace": params.thoughttrace.output,
        "behavior_annotations": b.annotations_output,
        "behavior_frequencies": b.frequencies_output,
        "behavior_tasks": params.behavior_tasks.output,
    }


def split_paths(params: Params) -> list[tuple[str, str, Path]]:
    s = params.splits
    return [(ds, split, Path(s.output_dir) / ds / f"{split}.parquet") for ds in s.datasets for split in s.fractions]


def gym_paths(params: Params) -> list[tuple[str, Path]]:
    return [(split, Path(params.gyms.output_dir) / f"{split}.parquet") for split in X.GYM_SPLITS]


def _or_none(fn: Callable[[], Any]) -> Any:
    """Cross-file inputs are best effort: a broken file is reported by its own suite."""
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None


def _n_rows(path: Path) -> int | None:
    return _or_none(lambda: pl.scan_parquet(path).select(pl.len()).collect().item()) if path.is_file() else None


def _thoughttrace_turns(path: Path) -> pl.DataFrame | None:
    return _or_none(lambda: pl.scan_parquet(path).select(
        pl.col("conversation_id"), pl.col("turns").list.len().cast(pl.Int64).alias("n_turns")).collect())


def _ids(path: Path, key: str) -> pl.Series | None:
    return _or_none(lambda: pl.scan_parquet(path).select(pl.col(key).cast(pl.String)).collect().to_series())


def _leaked_keys(params: Params) -> pl.Series | None:
    frames = []
    for _, split, path in split_paths(params):
        if path.is_file():
            names = _or_none(lambda: pl.read_parquet_schema(path)) or {}
            cols = [c for c in ("user_id", "conversation_id", "scenario_key") if c in names]
            frame = _or_none(lambda: pl.read_parquet(path, columns=cols))
            if frame is not None:
                frames.append((split, frame))
    return X.leaked_keys(frames) if frames else None


def _gym_leaked_keys(params: Params) -> pl.Series | None:
    """Task keys in two gyms splits, or None unless every split file is readable (then the check is skipped)."""
    frames = []
    for split, path in gym_paths(params):
        frame = _or_none(lambda: pl.read_parquet(path, columns=["data_source", "task_id"])) if path.is_file() else None
        if frame is None:
            return None
        frames.append((split, frame))
    return X.gym_leaked_keys(frames)


def _output_rows(params: Params, stage: str, outputs: dict[str, str]) -> int | None:
    """rows_out as counted from the stage's output files (None where that is not one count)."""
    if stage in OUTPUT_ROWS_STAGES:
        return _n_rows(Path(outputs[stage]))
    if stage == "gyms":
        counts = [_n_rows(path) for _, path in gym_paths(params)]
        return None if None in counts else sum(counts)
    return None


def _metrics_frame(stage: str, path: Path) -> pl.DataFrame:
    m = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(m, dict):
        raise ValueError(f"top level is {type(m).__name__}, not an object")
    by_reason = m.get("quarantine_by_reason")
    total = sum(by_reason.values()) if isinstance(by_reason, dict) and all(
        isinstance(v, int) for v in by_reason.values()) else None
    row = {"stage": stage, **{k: m.get(k) for k in ("rows_in", "rows_out", "rows_quarantined")},
           "quarantine_by_reason_total": total, **{k: m.get(k) for k in X.METRIC_ZEROS.get(stage, ())}}
    return pl.DataFrame([row], strict=False)


def targets(params: Params) -> list[Target]:
    """Every suite of the stage, in run order."""
    outputs = output_paths(params)
    envs = {"behavior_annotations": lambda: {"thoughttrace_turns": _thoughttrace_turns(Path(outputs["thoughttrace"]))}}
    out = [Target(X.DATASET_SPECS[name](params), Path(path), env=envs.get(name, dict))
           for name, path in outputs.items()]

    leaked = lru_cache(maxsize=1)(lambda: _leaked_keys(params))
    for dataset, split, path in split_paths(params):
        spec = X.split_spec(params, dataset, split)
        src = Path(params.splits.datasets[dataset])
        out.append(Target(spec, path, env=lambda spec=spec, src=src: {
            "leaked_keys": leaked(), "dataset_ids": _ids(src, spec.key[0])}))

    gym_leaked = lru_cache(maxsize=1)(lambda: _gym_leaked_keys(params))
    for split, path in gym_paths(params):
        out.append(Target(X.gyms_spec(params, split), path, env=lambda: {"gym_leaked_keys": gym_leaked()}))

    out += [Target(X.quarantine_spec(stage), quarantine_path(stage)) for stage in DATA_STAGES]
    for stage in DATA_STAGES:
        path = metrics_path(stage)
        out.append(Target(X.metrics_spec(stage), path, frame=lambda stage=stage, path=path: _metrics_frame(stage, path),
                          env=lambda stage=stage: {
                              "quarantine_rows": _n_rows(quarantine_path(stage)),
                              "output_rows": _output_rows(params, stage, outputs)}))
    return out


# --- running one suite ---------------------------------------------------------------------------

def _jsonable(v: Any) -> Any:
    if hasattr(v, "tolist"):          # numpy scalars and arrays
        v = v.tolist()
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, str):
        return v if len(v) <= MAX_CHARS else v[:MAX_CHARS] + "…"
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v[:N_UNEXPECTED * 4]]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float)):
        return v
    return _jsonable(str(v))


def _examples(spec: X.Spec, frame: pl.DataFrame, column: str | None, index: list[int]) -> list[dict]:
    if not index:
        return []
    rows = frame[[i for i in index[:N_UNEXPECTED] if 0 <= i < frame.height]]
    exprs = [pl.col(k) for k in spec.key if k in frame.columns]
    exprs += [e.alias(name) for name, e in X.show_exprs(spec, column).items()]
    try:
        return [_jsonable(r) for r in rows.select(exprs).iter_rows(named=True)]
    except Exception:  # noqa: BLE001 - showing examples must never break the report
        return [_jsonable(r) for r in rows.select([pl.col(k) for k in spec.key if k in frame.columns])
                .iter_rows(named=True)]


def _exception(info: Any) -> str | None:
    if not isinstance(info, dict):
        return None
    if "raised_exception" in info:
        return info.get("exception_message") if info.get("raised_exception") else None
    for sub in info.values():
        msg = _exception(sub)
        if msg:
            return msg
    return None


def _failure(spec: X.Spec, prepared: X.Prepared, er) -> dict[str, Any]:
    cfg = er.expectation_config
    res = er.result or {}
    column = cfg.kwargs.get("column")
    out: dict[str, Any] = {"expectation": cfg.type, "column": column, "doc": (cfg.meta or {}).get("doc", "")}
    mismatched = (res.get("details") or {}).get("mismatched")
    if isinstance(mismatched, dict):
        out["missing"] = mismatched.get("missing", [])
        out["unexpected"] = mismatched.get("unexpected", [])
        out["column"] = ", ".join(out["missing"] + out["unexpected"]) or None
    if "observed_value" in res:
        out["observed_value"] = _jsonable(res["observed_value"])
    if cfg.type == "expect_column_distinct_values_to_contain_set" and column in prepared.frame.columns:
        present = set(prepared.frame.get_column(column).drop_nulls().unique().to_list())
        out["missing"] = sorted(v for v in cfg.kwargs.get("value_set") or [] if v not in present)
    if "unexpected_count" in res:
        out["unexpected_count"] = res["unexpected_count"]
        out["element_count"] = res.get("element_count")
        out["unexpected_values"] = _jsonable(res.get("partial_unexpected_list") or [])
        out["examples"] = _examples(spec, prepared.frame, column, res.get("partial_unexpected_index_list") or [])
    exc = _exception(er.exception_info)
    if exc:
        out["exception"] = exc
    return out


def _suite_entry(path: Path, rows: int | None = None) -> dict[str, Any]:
    return {"file": str(path), "rows": rows, "success": True, "evaluated": 0, "failed": 0,
            "skipped": {}, "failures": []}


def _synthetic(entry: dict, expectation: str, column: str | None, doc: str, error: str) -> None:
    entry["evaluated"] += 1
    entry["failed"] += 1
    entry["success"] = False
    entry["failures"].append({"expectation": expectation, "column": column, "doc": doc, "exception": error})


def run_spec(spec: X.Spec, df: pl.DataFrame, env: dict, path: Path, runner: Runner) -> dict[str, Any]:
    prepared = X.prepare(spec, df, env)
    suite = X.build_suite(spec, prepared)
    result = runner.validate(suite, prepared.pandas)
    entry = _suite_entry(path, df.height)
    stats = result.statistics
    entry.update(success=bool(result.success), evaluated=int(stats["evaluated_expectations"]),
                 failed=int(stats["unsuccessful_expectations"]), skipped=dict(prepared.skipped))
    entry["failures"] = [_failure(spec, prepared, er) for er in result.results if not er.success]
    for name, err in prepared.errors.items():
        doc = next((d.doc for d in X.all_derived(spec) if d.name == name), "")
        _synthetic(entry, "compute_derived_column", name, doc, err)
    return entry


def _read(t: Target, report: dict[str, Any]) -> pl.DataFrame | None:
    """The target's frame, or None after recording why there is none."""
    if not t.path.is_file():
        if t.required:
            entry = _suite_entry(t.path)
            _synthetic(entry, "expect_file_to_exist", None, "the stage output exists", f"{t.path} does not exist")
            report[t.spec.name] = entry
        return None
    try:
        return t.frame() if t.frame is not None else pl.read_parquet(t.path)
    except Exception as e:  # noqa: BLE001 - unreadable outputs are validation failures
        entry = _suite_entry(t.path)
        what = "a JSON object" if t.frame is not None else "a parquet file"
        _synthetic(entry, "expect_file_to_be_readable", None, f"the file is {what}", f"{type(e).__name__}: {e}")
        report[t.spec.name] = entry
        return None


def run_target(t: Target, runner: Runner, report: dict[str, Any]) -> None:
    """Validate one target (and its flattened messages) into ``report``."""
    df = _read(t, report)
    if df is None:
        return
    report[t.spec.name] = run_spec(t.spec, df, t.env(), t.path, runner)
    if t.spec.flatten_messages and t.spec.key and t.spec.key[0] in df.columns and "messages" in df.columns:
        sub = X.messages_spec(t.spec)
        try:
            flat = X.flatten_messages(df, t.spec.key[0])
        except Exception as e:  # noqa: BLE001
            entry = _suite_entry(t.path)
            _synthetic(entry, "flatten_messages", "messages", "messages is list[struct{role, content}]",
                       f"{type(e).__name__}: {e}")
            report[sub.name] = entry
        else:
            report[sub.name] = run_spec(sub, flat, {}, t.path, runner)


def validate_all(params: Params, runner: Runner | None = None, only: list[str] | None = None) -> dict[str, Any]:
    """Run every suite (or those whose name matches a glob in ``only``); return the report."""
    runner = runner or get_runner()
    t0 = time.perf_counter()
    suites: dict[str, Any] = {}
    for t in targets(params):
        names = [t.spec.name] + ([X.messages_spec(t.spec).name] if t.spec.flatten_messages else [])
        if not only or any(fnmatch.fnmatchcase(n, pat) for n in names for pat in only):
            run_target(t, runner, suites)
    return {
        "success": all(s["success"] for s in suites.values()),
        "suites_total": len(suites),
        "suites_failed": sum(not s["success"] for s in suites.values()),
        "evaluated": sum(s["evaluated"] for s in suites.values()),
        "failed": sum(s["failed"] for s in suites.values()),
        "seconds": round(time.perf_counter() - t0, 3),
        "suites": suites,
    }


# --- messages, tracking, CLI ----------------------------------------------------------------------

def failure_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for name, suite in report["suites"].items():
        for f in suite["failures"]:
            col = f"column `{f['column']}`" if f.get("column") else "table"
            parts = [f"{STAGE}: FAILED suite `{name}`: {f['expectation']} on {col}"]
            if f.get("doc"):
                parts.append(f"({f['doc']})")
            if "unexpected_count" in f:
                parts.append(f"- {f['unexpected_count']} of {f['element_count']} unexpected, e.g. "
                             f"{json.dumps(f['unexpected_values'], ensure_ascii=False)}")
            if "unexpected" not in f and f.get("missing"):
                parts.append(f"- missing {f['missing']}")
            elif f.get("missing") or f.get("unexpected"):
                parts.append(f"- missing {f.get('missing')}, unexpected {f.get('unexpected')}")
            elif "observed_value" in f and "unexpected_count" not in f:
                parts.append(f"- observed {json.dumps(f['observed_value'], ensure_ascii=False)}")
            if f.get("examples"):
                parts.append(f"- rows {json.dumps(f['examples'], ensure_ascii=False)}")
            if f.get("exception"):
                parts.append(f"- error: {f['exception']}")
            parts.append(f"[{suite['file']}]")
            lines.append(" ".join(parts))
    return lines


def track(params: Params, report: dict[str, Any], report_path: Path, params_path: Path) -> str | None:
    from mimesis_lab.tracking import file_sha256
    from mimesis_lab.tracking import record_stage_run

    metrics: dict[str, float] = {
        "success": float(report["success"]), "suites_total": report["suites_total"],
        "suites_failed": report["suites_failed"], "expectations_evaluated": report["evaluated"],
        "expectations_failed": report["failed"], "seconds": report["seconds"],
    }
    for name, s in report["suites"].items():
        key = name.replace(":", "_")
        metrics[f"suite.{key}.success"] = float(s["success"])
        metrics[f"suite.{key}.failed"] = float(s["failed"])
    hashes = {s["file"]: file_sha256(Path(s["file"])) for s in report["suites"].values() if Path(s["file"]).is_file()}
    return record_stage_run(params.tracking, STAGE, flatten(params.validate_, f"{STAGE}."), metrics, hashes,
                         artifacts=[report_path, params_path])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"stages.{STAGE}")
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("--no-track", action="store_true", help="do not record the run in MLflow")
    parser.add_argument("--suite", action="append", metavar="GLOB",
                        help="run only the suites matching GLOB (repeatable; for debugging, e.g. 'splits/*')")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("great_expectations").setLevel(logging.WARNING)  # its INFO is import-time noise
    t0 = time.perf_counter()
    try:
        params = load_params(args.params)
    except ConfigError as e:
        print(f"{STAGE}: error: {e}", file=sys.stderr)
        return 2
    report = validate_all(params, only=args.suite)
    report_path = Path(params.validate_.report)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    for line in failure_lines(report):
        print(line, file=sys.stderr)
    log.info("%s: %d suites, %d expectations, %d failed (%d suites) in %.2fs -> %s", STAGE,
             report["suites_total"], report["evaluated"], report["failed"], report["suites_failed"],
             report["seconds"], report_path)
    work_s = time.perf_counter() - t0
    if not args.no_track:
        line = track(params, report, report_path, Path(args.params))
        if line:
            log.info("%s: %s", STAGE, line)
    # bench/bench_overhead.py reads "work" (as of every data stage): reading and checking the outputs
    log.info("%s: done in %.2fs (work %.2fs, tracking %.2fs)", STAGE, time.perf_counter() - t0, work_s,
             time.perf_counter() - t0 - work_s)
    if not report["success"] and params.validate_.fail_on_error:
        print(f"{STAGE}: {report['failed']} expectation(s) failed in {report['suites_failed']} suite(s); "
              f"see {report_path}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main())
