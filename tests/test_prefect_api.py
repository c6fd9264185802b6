"""One Prefect API server per Prefect home (flows/prefect_api.py): started on demand, reused by later
flow processes, kept alive by their leases, stopped when idle; real `prefect server` processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from flows import prefect_api
from mimesis_lab.tracking import process_alive

ROOT = Path(__file__).resolve().parents[1]


def _wait(cond, timeout_s: float) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.25)
    return cond()


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("MIMESIS_PREFECT_SERVER", raising=False)
    return monkeypatch


def test_opt_outs_start_nothing(tmp_path, clean_env):
    clean_env.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")
    assert prefect_api.use_shared_server(tmp_path) is None
    clean_env.delenv("PREFECT_API_URL")
    clean_env.setenv("MIMESIS_PREFECT_SERVER", "ephemeral")
    assert prefect_api.use_shared_server(tmp_path) is None
    assert not (tmp_path / "shared_api").exists()


def test_shared_server_is_reused_leased_and_stopped_when_idle(tmp_path, clean_env):
    home = tmp_path / "home"
    # a flow process: takes a lease, runs a real flow against the shared API, exits
    code = ("import sys; from pathlib import Path; from prefect import flow\n"
            "from flows.prefect_api import shared_server\n"
            "@flow\n"
            "def f():\n    return 41 + 1\n"
            "with shared_server(Path(sys.argv[1])) as url:\n    assert f() == 42\n    print(url)\n")
    env = {**os.environ, "PREFECT_HOME": str(home), "MIMESIS_PREFECT_IDLE_S": "4", "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    first = subprocess.run([sys.executable, "-c", code, str(home)], env=env, capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    url = first.stdout.strip().splitlines()[-1]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/api")
    state = json.loads((home / "shared_api" / "state.json").read_text())
    assert state["api_url"] == url and process_alive(state["pid"])

    # a second process reuses the same server (no new start) while it still runs
    t0 = time.time()
    second = subprocess.run([sys.executable, "-c", code, str(home)], env=env, capture_output=True, text=True,
                            timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.strip().splitlines()[-1] == url
    assert json.loads((home / "shared_api" / "state.json").read_text())["pid"] == state["pid"]
    # both flow runs are in the one database the server serves
    with urllib.request.urlopen(urllib.request.Request(f"{url}/flow_runs/filter", data=b"{}", method="POST",
                                                       headers={"Content-Type": "application/json"})) as r:
        runs = json.loads(r.read())
    assert sum(run["state_type"] == "COMPLETED" for run in runs) >= 2, time.time() - t0

    # a live lease keeps it up past idle_s; once the holder is gone it stops and cleans up
    holder = subprocess.Popen([sys.executable, "-c", "import sys,time; from pathlib import Path\n"
                               "from flows.prefect_api import use_shared_server\n"
                               "print(use_shared_server(Path(sys.argv[1])), flush=True); time.sleep(8)", str(home)],
                              env=env, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == url
    time.sleep(5)
    assert process_alive(state["pid"]), "stopped while a lease was held"
    holder.wait(timeout=30)
    assert _wait(lambda: not process_alive(state["pid"]), 30), "still running after idle_s without leases"
    assert not (home / "shared_api" / "state.json").exists()
    assert not process_alive(state["server_pid"])
    assert "stopped: idle for 4 s" in (home / "shared_api" / "server.log").read_text()


@pytest.mark.long
def test_stop_command(tmp_path, clean_env):
    home = tmp_path / "home"
    clean_env.setenv("PREFECT_HOME", str(home))
    assert prefect_api.stop(home) is False
    url = prefect_api.use_shared_server(home, idle_s=600)
    state = prefect_api.status(home)
    assert state["alive"] and state["api_url"] == url
    out = subprocess.run([sys.executable, "-m", "flows.prefect_api", "stop", "--home", str(home)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "stopped" in out.stdout
    assert _wait(lambda: not process_alive(state["server_pid"]), 30)
    assert prefect_api.status(home) == {"alive": False}


@pytest.mark.long
def test_prestart_starts_in_the_background_and_a_flow_waits_for_it(tmp_path, clean_env):
    """`prestart` (what the data stages run under dvc repro) returns at once, a second one starts nothing, and
    a flow process that comes while the server still starts waits for that server instead of starting another."""
    home = tmp_path / "home"
    clean_env.setenv("PREFECT_HOME", str(home))
    clean_env.setenv("MIMESIS_PREFECT_PRESTART", "0")
    assert prefect_api.prestart(home) is False and not (home / "shared_api").exists()
    clean_env.delenv("MIMESIS_PREFECT_PRESTART")
    t0 = time.time()
    assert prefect_api.prestart(home, idle_s=600) is True
    assert time.time() - t0 < 5, "prestart waited for the server"
    marker = json.loads((home / "shared_api" / "state.json").read_text())
    assert marker.get("starting") or marker.get("api_url")
    assert prefect_api.prestart(home, idle_s=600) is False               # starting: no second server
    url = prefect_api.use_shared_server(home, idle_s=600)                 # waits for the prestarted one
    state = prefect_api.status(home)
    try:
        assert state["alive"] and state["api_url"] == url and state["port"] == marker["port"]
        assert prefect_api.prestart(home, idle_s=600) is False           # running: nothing started
        assert json.loads((home / "shared_api" / "state.json").read_text())["pid"] == state["pid"]
    finally:
        prefect_api.stop(home)
    assert _wait(lambda: not process_alive(state["server_pid"]), 30)


def test_a_stale_starting_marker_does_not_block_a_start(tmp_path, clean_env):
    """A start marker whose supervisor never came (older than the start timeout) is ignored."""
    home = tmp_path / "home"
    d = home / "shared_api"
    d.mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"starting": True, "port": 1, "since": time.time() - 3600}))
    assert prefect_api._starting(home.resolve()) == {}
    (d / "state.json").write_text(json.dumps({"starting": True, "port": 1, "since": time.time()}))
    assert prefect_api._starting(home.resolve())["port"] == 1
