"""Deferred data-stage runs (mimesis_lab.tracking_queue): a queued record reaches MLflow as the same run a
direct log_stage_run makes; MLflow's refusals are kept with their reason; one drainer at a time; a stage under
``dvc repro`` (DVC_STAGE) queues its run and the drainer it starts logs it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mimesis_lab import tracking_queue as tq
from mimesis_lab.config import TrackingParams
from mimesis_lab.tracking import log_stage_run

ROOT = Path(__file__).resolve().parents[1]


def _tracking(tmp: Path) -> TrackingParams:
    return TrackingParams(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}", artifact_location=str(tmp / "artifacts"),
                          experiment="q")


def _runs(tmp: Path):
    import mlflow

    c = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")
    exp = c.get_experiment_by_name("q")
    return c, (c.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"]) if exp else [])


def test_deferred_follows_dvc_stage_and_the_switch(monkeypatch):
    monkeypatch.delenv("DVC_STAGE", raising=False)
    monkeypatch.delenv(tq.DEFER_ENV, raising=False)
    assert not tq.deferred()
    monkeypatch.setenv("DVC_STAGE", "role_swap")
    assert tq.deferred()
    monkeypatch.setenv(tq.DEFER_ENV, "0")
    assert not tq.deferred()
    monkeypatch.delenv("DVC_STAGE")
    monkeypatch.setenv(tq.DEFER_ENV, "1")
    assert tq.deferred()


def test_a_queued_run_is_the_run_log_stage_run_makes(tmp_path, monkeypatch):
    monkeypatch.setenv("MIMESIS_PARENT_RUN_ID", "")      # no parent in either
    tr = _tracking(tmp_path)
    art = tmp_path / "m.json"
    art.write_text('{"rows_in": 3}')
    params = {f"role_swap.p{i}": i for i in range(130)}   # more than one log_batch of params
    metrics = {"rows_in": 3.0, "rows_out": 2.0, "rows_quarantined": 1.0}
    hashes = {"data/raw/a.jsonl": "ab" * 32}
    direct = log_stage_run(tr, "role_swap", params, metrics, hashes, artifacts=[art])
    t0 = int(time.time() * 1000) - 5000
    rec = tq.enqueue(tr, "role_swap", params, metrics, hashes, artifacts=[art], start_time_ms=t0,
                     root=tmp_path, start_drainer=False)
    art.write_text('{"rows_in": 999}')                    # rewritten after the stage: the record keeps its copy
    assert tq.pending(tmp_path) == [rec]
    assert tq.drain(tmp_path, idle_s=0) == {"logged": 1, "failed": 0}
    assert tq.pending(tmp_path) == [] and not rec.exists()
    c, runs = _runs(tmp_path)
    assert len(runs) == 2
    a, b = (r for r in runs if r.info.run_id == direct), (r for r in runs if r.info.run_id != direct)
    a, b = next(a), next(b)
    assert b.info.run_name == "role_swap" and b.info.status == "FINISHED" and b.info.start_time == t0
    assert b.data.params == a.data.params and b.data.metrics == a.data.metrics
    for k in ("mimesis.stage", "mimesis.kind", "input_sha256.a.jsonl", "mlflow.user", "mlflow.source.type"):
        assert b.data.tags[k] == a.data.tags[k], k
    assert {"git_commit", "git_dirty"} <= set(b.data.tags)     # of tmp_path here (no repository: "unknown")
    files = {f.path for f in c.list_artifacts(b.info.run_id)}
    assert files == {f.path for f in c.list_artifacts(a.info.run_id)} == {"m.json", "provenance.json"}
    got = Path(c.download_artifacts(b.info.run_id, "m.json", str(tmp_path / "dl")))
    assert json.loads(got.read_text()) == {"rows_in": 3}


def test_a_refused_record_is_kept_with_its_reason_and_retried(tmp_path):
    tr = _tracking(tmp_path)
    good = tq.enqueue(tr, "splits", {"a": 1}, {"rows_in": 1.0}, {}, root=tmp_path, start_drainer=False)
    bad = tq.enqueue(tr, "gyms", {"a": 1}, {"rows_in": 1.0}, {}, root=tmp_path, start_drainer=False)
    rec = json.loads((bad / tq.RECORD).read_text())
    rec["metrics"] = {"rows_in": "not a number"}
    (bad / tq.RECORD).write_text(json.dumps(rec))
    assert tq.drain(tmp_path, idle_s=0) == {"logged": 1, "failed": 1}
    kept = tq.failed(tmp_path)
    assert [p.name for p in kept] == [bad.name]
    assert (kept[0] / "error.txt").read_text().strip()       # MLflow's reason, kept with the record
    assert tq.wait_drained(tmp_path, timeout_s=1)["failed"] == 1
    rec["metrics"] = {"rows_in": 2.0}
    (kept[0] / tq.RECORD).write_text(json.dumps(rec))
    assert tq.drain(tmp_path, idle_s=0, retry_failed=True) == {"logged": 1, "failed": 0}
    assert tq.failed(tmp_path) == [] and tq.pending(tmp_path) == []
    _, runs = _runs(tmp_path)
    assert sorted(r.info.run_name for r in runs) == ["gyms", "splits"] and good.name < bad.name


def test_one_drainer_at_a_time_and_wait_drained_logs_what_nobody_holds(tmp_path):
    tr = _tracking(tmp_path)
    tq.enqueue(tr, "world", {}, {"rows_in": 1.0}, {}, root=tmp_path, start_drainer=False)
    with tq._drain_lock(tmp_path) as mine:
        assert mine
        t = time.monotonic()
        assert tq.drain(tmp_path, idle_s=5, wait_for_lock=False) == {"logged": 0, "failed": 0}
        assert time.monotonic() - t < 1.0                  # returned at once: another drainer holds the lock
        assert tq.wait_drained(tmp_path, timeout_s=0.5)["pending"] == 1
    out = tq.wait_drained(tmp_path, timeout_s=30)          # nobody holds the lock now: logged here
    assert out["pending"] == 0 and out["failed"] == 0
    assert [r.info.run_name for r in _runs(tmp_path)[1]] == ["world"]


def test_a_stage_under_dvc_queues_its_run_and_the_drainer_logs_it(tmp_path):
    """A real stage process (``world`` on the test profile, in a copy of the project) with DVC_STAGE set: it
    queues its run; the detached drainer it started logs it (params, metrics, artifacts)."""
    proj = tmp_path / "proj"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for rel in filter(None, files):
        if (ROOT / rel).is_file() and not rel.startswith(("tests/", "bench/")):
            (proj / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, proj / rel)
    subprocess.run([sys.executable, "-m", "mimesis_lab.config", "--params", "params.yaml", "--profile",
                    "configs/test/params.test.yaml", "-o", "params.yaml"], cwd=proj, check=True)
    env = {**os.environ, "DVC_STAGE": "world", "MIMESIS_PREFECT_PRESTART": "0"}
    env.pop(tq.DEFER_ENV, None)
    env.pop("MIMESIS_PARENT_RUN_ID", None)
    res = subprocess.run([sys.executable, "-m", "stages.world"], cwd=proj, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "MLflow run queued" in res.stderr, res.stderr[-2000:]
    deadline = time.monotonic() + 120
    while tq.pending(proj) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert tq.pending(proj) == [] and tq.failed(proj) == []
    import mlflow

    c = mlflow.MlflowClient(tracking_uri=f"sqlite:///{proj / 'mlflow' / 'mlflow.db'}")
    runs = c.search_runs([c.get_experiment_by_name("mimesis").experiment_id])
    assert [r.info.run_name for r in runs] == ["world"]
    r = runs[0]
    assert r.info.status == "FINISHED" and r.data.tags["mimesis.kind"] == "data"
    assert r.data.metrics["rows_in"] == r.data.metrics["rows_out"] + r.data.metrics["rows_quarantined"]
    assert "world.seed" in r.data.params
    assert {f.path for f in c.list_artifacts(r.info.run_id)} == {"world.json", "params.yaml", "provenance.json"}
