"""Runs left RUNNING by a process killed with SIGKILL: the next start of the phase marks its MLflow runs FAILED
(``mimesis.killed=true``) and its Prefect flow runs CRASHED. Real MLflow (a sqlite store in a tmp folder), a
real Prefect server (a temporary one) and real processes killed with SIGKILL."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mimesis_lab import tracking
from mimesis_lab.config import TrackingParams
from tests.conftest import ROOT


def spawn(code: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``python -c code`` (it prints one line, then sleeps) and return the process and that line."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    line = proc.stdout.readline().strip()
    if not line:
        proc.kill()
        raise AssertionError(f"the child printed nothing: {proc.stderr.read()[-3000:]}")
    return proc, line


def sigkill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()


def test_process_alive_tells_a_reused_pid_apart():
    me = tracking.process_identity()
    assert me["mimesis.pid"] == str(os.getpid()) and me["mimesis.pid_started"].isdigit()
    assert tracking.process_alive(os.getpid(), me["mimesis.pid_started"])
    assert not tracking.process_alive(os.getpid(), str(int(me["mimesis.pid_started"]) + 1))   # same pid, later start
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert not tracking.process_alive(int(done.stdout))


def test_process_age_counts_from_the_process_start():
    assert 0 < tracking.process_age_s() < 24 * 3600
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        assert 0.4 < tracking.process_age_s(child.pid) < 30
    finally:
        child.kill()
        child.wait()
    assert tracking.process_age_s(child.pid) is None                   # gone


def test_mlflow_runs_of_a_killed_phase_are_marked_failed(tmp_path):
    t = TrackingParams(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", artifact_location=str(tmp_path / "art"),
                       experiment="killed-test")
    victim, line = spawn(f"""
        import time
        from mimesis_lab import tracking
        from mimesis_lab.config import TrackingParams
        t = TrackingParams.model_validate({t.model_dump()!r})
        parent = tracking.create_run(t, "sft", tags={{"mimesis.kind": "flow", "mimesis.phases": "sft"}})
        child = tracking.create_run(t, "sft", parent, tags={{"mimesis.phase": "sft", "mimesis.kind": "train"}})
        other = tracking.create_run(t, "midtrain", tags={{"mimesis.phase": "midtrain"}})
        print(parent, child, other, flush=True)
        time.sleep(300)
    """)
    parent, child, other_phase = line.split()
    sigkill(victim)
    live = tracking.create_run(t, "sft", tags={"mimesis.phase": "sft"})            # this process: alive
    c, _ = tracking.client(t)
    elsewhere = tracking.create_run(t, "sft", tags={"mimesis.phase": "sft", "mimesis.host": "another-host",
                                                    "mimesis.pid": str(victim.pid)})
    untagged = c.create_run(c.get_run(live).info.experiment_id, run_name="sft").info.run_id     # an older run

    killed = tracking.mark_killed_runs(t, "sft")

    assert sorted(killed) == sorted([parent, child])
    status = {r: c.get_run(r).info.status for r in (parent, child, other_phase, live, elsewhere, untagged)}
    assert status == {parent: "FAILED", child: "FAILED", other_phase: "RUNNING", live: "RUNNING",
                      elsewhere: "RUNNING", untagged: "RUNNING"}
    assert c.get_run(child).data.tags["mimesis.killed"] == "true"
    assert c.get_run(child).info.end_time is not None
    assert tracking.mark_killed_runs(t, "sft") == []                                  # idempotent
    assert tracking.mark_killed_runs(t, "midtrain") == [other_phase]


@pytest.fixture(scope="module")
def prefect_api():
    """A temporary Prefect server with its own database for this module; yields its API URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


def test_prefect_flow_runs_of_a_killed_process_are_crashed(prefect_api, tmp_path):
    env = {"PREFECT_API_URL": prefect_api, "PREFECT_HOME": str(tmp_path / "home")}
    victim, line = spawn("""
        import time
        from prefect import flow
        from prefect.runtime import flow_run
        from flows.crashed import claim_flow_run

        @flow(name="victim")
        def victim():
            claim_flow_run()
            print(flow_run.id, flush=True)
            time.sleep(300)

        victim()
    """, env)
    victim_run = line.split()[-1]
    sigkill(victim)
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    from flows.crashed import PROCESS_TAG, claim_flow_run

    @flow(name="next-start")
    def next_start() -> tuple[str, list[str]]:
        return str(flow_run.id), claim_flow_run()

    me, crashed = next_start()
    assert crashed == [victim_run]
    with get_client(sync_client=True) as client:
        dead, mine = client.read_flow_run(victim_run), client.read_flow_run(me)
    assert dead.state.type.value == "CRASHED" and str(victim.pid) in dead.state.message
    assert any(t.startswith(PROCESS_TAG) and f":{victim.pid}:" in t for t in dead.tags)
    assert mine.state.type.value == "COMPLETED" and any(t.startswith(PROCESS_TAG) for t in mine.tags)
    assert json.dumps(claim_flow_run()) == "[]"                       # outside a flow: nothing left to crash
