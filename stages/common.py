"""The shared edge of every data stage: outputs, quarantine, metrics, MLflow.

A stage module builds a :class:`StageResult` from validated params (pure work plus
reading its inputs) and calls :func:`main`, which writes

- each output parquet,
- ``data/quarantine/<stage>.parquet`` (``source_file``, ``row``, ``reason``, ``raw``),
- ``metrics/<stage>.json`` with ``rows_in``, ``rows_out``, ``rows_quarantined`` (+ extras),

checks ``rows_in == rows_out + rows_quarantined`` (a mismatch is a bug and fails the
stage), logs the counts, and records the run in MLflow.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import polars as pl

from mimesis_lab.config import ConfigError, Params, flatten, load_params
from mimesis_lab.io import InputFileError, Quarantine

log = logging.getLogger("mimesis.stages")

QUARANTINE_DIR = Path("data/quarantine")
METRICS_DIR = Path("metrics")


class StageError(RuntimeError):
    """A stage cannot produce valid output (message names what is wrong)."""


class PartWriter:
    """Spills an output chunk by chunk to parquet parts, so memory is bounded by one chunk.

    Parts live in a hidden temporary folder next to the final output (same file
    system). Columns known only at the end (e.g. the mixture ``copies``) are attached
    with :meth:`add_column`. :func:`write_output` streams the parts, one at a time, into
    the final file; :meth:`cleanup` removes them.
    """

    def __init__(self, output: str | Path):
        parent = Path(output).parent
        parent.mkdir(parents=True, exist_ok=True)
        self._dir = tempfile.TemporaryDirectory(prefix=f".{Path(output).stem}-parts-", dir=parent)
        self.parts: list[tuple[str, int]] = []
        self.rows = 0
        self.late: dict[str, tuple[pl.DataType, Any]] = {}
        self.columns: list[str] | None = None

    def write(self, df: pl.DataFrame) -> None:
        path = str(Path(self._dir.name) / f"part-{len(self.parts):06d}.parquet")
        df.write_parquet(path, compression="lz4", statistics=False)
        self.parts.append((path, df.height))
        self.rows += df.height

    def add_column(self, name: str, values: Any, dtype: pl.DataType) -> None:
        """A column for all rows written so far, in write order (sliced per part)."""
        if len(values) != self.rows:
            raise StageError(f"column {name!r} has {len(values)} values for {self.rows} rows")
        self.late[name] = (dtype, values)

    def select(self, columns: list[str]) -> "PartWriter":
        """Final column order."""
        self.columns = columns
        return self

    def iter_frames(self):
        if not self.parts:
            raise StageError("no output chunk was written")
        offset = 0
        for path, n in self.parts:
            df = pl.read_parquet(path)
            if self.late:
                df = df.with_columns([pl.Series(k, v[offset:offset + n], dtype=dt)
                                      for k, (dt, v) in self.late.items()])
            offset += n
            yield df.select(self.columns) if self.columns else df

    def collect(self) -> pl.DataFrame:
        return pl.concat(list(self.iter_frames()))

    def sink(self, path: str | Path) -> None:
        import pyarrow.parquet as pq

        writer = None
        try:
            for df in self.iter_frames():
                table = df.to_arrow()
                if writer is None:
                    writer = pq.ParquetWriter(str(path), table.schema, compression="zstd")
                writer.write_table(table)
        finally:
            if writer is not None:
                writer.close()

    def cleanup(self) -> None:
        self._dir.cleanup()


@dataclass
class StageResult:
    outputs: dict[str, pl.DataFrame | PartWriter]
    rows_in: int
    rows_out: int
    quarantine: Quarantine
    inputs: list[Path] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def frame(self, path: str) -> pl.DataFrame:
        """An output as one DataFrame (collecting spilled parts)."""
        out = self.outputs[path]
        return out.collect() if isinstance(out, PartWriter) else out

    def close(self) -> None:
        for fn in self.cleanup:
            fn()
        self.cleanup.clear()


def write_output(path: str | Path, frame: pl.DataFrame | PartWriter) -> None:
    """Write a parquet output; spilled parts are streamed one at a time (never fully materialised)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    if isinstance(frame, PartWriter):
        frame.sink(path)
    else:
        frame.write_parquet(path)


def metrics_path(stage: str) -> Path:
    return METRICS_DIR / f"{stage}.json"


def quarantine_path(stage: str) -> Path:
    return QUARANTINE_DIR / f"{stage}.parquet"


def write_result(stage: str, result: StageResult) -> dict[str, Any]:
    """Write outputs, quarantine and metrics; return the metrics dict."""
    q = result.quarantine.to_frame().sort("source_file", "row", maintain_order=True)
    if result.rows_in != result.rows_out + q.height:
        result.close()
        raise StageError(
            f"{stage}: row accounting broken: rows_in={result.rows_in} != rows_out={result.rows_out} "
            f"+ rows_quarantined={q.height}"
        )
    try:
        for path, df in result.outputs.items():
            write_output(path, df)
    finally:
        result.close()
    qpath = quarantine_path(stage)
    qpath.parent.mkdir(parents=True, exist_ok=True)
    q.write_parquet(qpath)
    reasons = (
        q.with_columns(pl.col("reason").str.extract(r"^([^:]+)", 1).alias("kind"))
        .group_by("kind").len().sort("kind")
    )
    metrics: dict[str, Any] = {
        "rows_in": result.rows_in,
        "rows_out": result.rows_out,
        "rows_quarantined": q.height,
        "quarantine_by_reason": {r["kind"]: r["len"] for r in reasons.iter_rows(named=True)},
        **result.extra,
    }
    mpath = metrics_path(stage)
    mpath.parent.mkdir(parents=True, exist_ok=True)
    mpath.write_text(json.dumps(metrics, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    log.info(
        "%s: rows_in=%d rows_out=%d rows_quarantined=%d -> %s",
        stage, result.rows_in, result.rows_out, q.height, ", ".join(result.outputs) or "-",
    )
    return metrics


def _scalar_metrics(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in metrics.items():
        key = f"{prefix}{k}"
        if isinstance(v, bool):
            out[key] = float(v)
        elif isinstance(v, (int, float)):
            out[key] = float(v)
        elif isinstance(v, dict):
            out.update(_scalar_metrics(v, key + "."))
    return {k.replace(" ", "_")[:250]: v for k, v in out.items()}


def track(stage: str, params: Params, section: Any, result: StageResult, metrics: dict[str, Any],
          start_time_ms: int | None = None) -> str | None:
    """Record the stage run in MLflow (queued under ``dvc repro``: :mod:`mimesis_lab.tracking_queue`);
    returns the line to log."""
    from mimesis_lab.tracking import file_sha256
    from mimesis_lab.tracking import record_stage_run

    hashes = {str(p): file_sha256(p) for p in result.inputs if Path(p).is_file()}
    return record_stage_run(
        params.tracking,
        stage,
        flatten(section, f"{stage}."),
        _scalar_metrics(metrics),
        hashes,
        artifacts=[metrics_path(stage), Path("params.yaml")],
        start_time_ms=start_time_ms,
    )


def prestart_prefect() -> None:
    """Under ``dvc repro`` (``DVC_STAGE`` set), have the shared Prefect server of the training and evaluation
    flows start in the background now (``python -m flows.prefect_api prestart``, a detached process: nothing
    waits for it), so its start overlaps the data stages instead of delaying the first flow."""
    try:
        subprocess.Popen([sys.executable, "-m", "flows.prefect_api", "prestart"], cwd=Path(__file__).resolve().parents[1],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    except OSError as e:       # an optimisation only: the first flow starts the server itself
        log.warning("could not start the shared Prefect server in the background: %s", e)


def main(stage: str, build: Callable[[Params], StageResult], section: Callable[[Params], Any],
         argv: list[str] | None = None) -> int:
    """CLI entry of a stage: ``python -m stages.<stage> [--params params.yaml] [--no-track]``."""
    parser = argparse.ArgumentParser(prog=f"stages.{stage}")
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("--no-track", action="store_true", help="do not record the run in MLflow")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("great_expectations").setLevel(logging.WARNING)   # its INFO is import-time noise
    if os.environ.get("DVC_STAGE"):
        prestart_prefect()
    t0, started_ms = time.perf_counter(), int(time.time() * 1000)
    try:
        params = load_params(args.params)
        result = build(params)
        metrics = write_result(stage, result)
    except (ConfigError, InputFileError, StageError) as e:
        print(f"{stage}: error: {e}", file=sys.stderr)
        return 2
    work_s = time.perf_counter() - t0
    if not args.no_track:
        line = track(stage, params, section(params), result, metrics, start_time_ms=started_ms)
        if line:
            log.info("%s: %s", stage, line)
    # bench/bench_overhead.py reads "work": the stage's own reading, computing and writing
    log.info("%s: done in %.2fs (work %.2fs, tracking %.2fs)", stage, time.perf_counter() - t0, work_s,
             time.perf_counter() - t0 - work_s)
    return 0
