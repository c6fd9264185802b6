"""``make ui`` / ``flows.ui`` with real processes and real sockets on 127.0.0.1: another clone's UI on the
ports is named and refused (no server of ours answers for it), a running UI is not started twice or silently
moved, a failed start leaves no process behind, and a start/stop cycle of the real Prefect and MLflow servers
leaves nothing (no process, no ``/dev/shm`` folder, no state)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flows import ui
from mimesis_lab.train.launch import free_port

HEALTHY = textwrap.dedent("""
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Ok(BaseHTTPRequestHandler):          # answers every health check, like a running server
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok)
    print("up", flush=True)
    server.serve_forever()
""")


def processes_in(folder: Path) -> list[int]:
    """Pids of this user's processes whose working directory is ``folder`` (the UI starts its servers there)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if Path(os.readlink(d / "cwd")) == folder.resolve():
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def shm_folders() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if p.is_dir()} if Path("/dev/shm").is_dir() else set()


@pytest.fixture
def other_clone(tmp_path):
    """Another clone's UI: two servers answering health checks on two ports, run from that clone's folder."""
    folder = tmp_path / "other-clone"
    folder.mkdir()
    ports, procs = [free_port(), free_port()], []
    for port in ports:
        p = subprocess.Popen([sys.executable, "-c", HEALTHY, str(port)], cwd=folder, stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "up"
        procs.append(p)
    yield folder, ports, procs
    for p in procs:
        p.kill()
        p.wait()
        p.stdout.close()


def test_another_clones_ui_on_the_ports_is_named_and_refused(tmp_path, other_clone, capsys):
    folder, (prefect_port, mlflow_port), procs = other_clone
    mine = tmp_path / "my-clone"
    mine.mkdir()
    code = ui.main(["start", "--root", str(mine), "--prefect-port", str(prefect_port), "--mlflow-port",
                    str(mlflow_port), "--no-serve"])
    err = capsys.readouterr().err
    assert code == 4, err
    assert f"port {prefect_port} is taken by pid {procs[0].pid}" in err and str(folder) in err
    assert "Prefect UI" not in capsys.readouterr().out                # no URL of someone else's UI printed
    assert processes_in(mine) == [] and not (mine / ".ui" / "state.json").exists()
    # a free Prefect port does not help: the MLflow one is checked before anything starts
    code = ui.main(["start", "--root", str(mine), "--prefect-port", str(free_port()), "--mlflow-port",
                    str(mlflow_port), "--no-serve"])
    assert code == 4 and f"mlflow port {mlflow_port} is taken" in capsys.readouterr().err
    assert processes_in(mine) == []


def test_this_projects_ui_without_its_state_is_recognised(tmp_path, capsys):
    port = free_port()
    p = subprocess.Popen([sys.executable, "-c", HEALTHY, str(port)], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "up"
        assert ui.main(["start", "--root", str(tmp_path), "--prefect-port", str(port), "--no-serve"]) == 3
        assert "a UI of this project already answers" in capsys.readouterr().err
    finally:
        p.kill()
        p.wait()
        p.stdout.close()


def test_a_busy_default_port_moves_to_the_next_free_one(tmp_path, monkeypatch, capsys):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        monkeypatch.setitem(ui.DEFAULT_PORTS, "prefect", busy)
        got = ui._pick_port(tmp_path, "127.0.0.1", "prefect", None)
        assert got > busy and ui.port_free("127.0.0.1", got)
        assert f"port {busy} is taken by pid {os.getpid()}" in capsys.readouterr().out
        with pytest.raises(ui.UIError) as e:                       # an explicit port is never moved
            ui._pick_port(tmp_path, "127.0.0.1", "prefect", busy)
        assert e.value.code == 4


def test_a_failed_start_stops_every_process_it_started(tmp_path, monkeypatch):
    """Prefect "fails" once MLflow is up with its worker: every process of both trees is stopped."""
    import urllib.request

    seen: dict[str, list[int]] = {}

    def prefect_fails_when_mlflow_is_up(url, port, timeout_s, proc, log):
        if url.endswith("/api/health"):
            state = ui._read_state(tmp_path)
            deadline = time.time() + 120
            while time.time() < deadline:
                try:
                    urllib.request.urlopen(f"{state['mlflow_ui']}/health", timeout=2).close()
                    break
                except OSError:
                    time.sleep(0.5)
            seen.update({name: ui.process_tree(pid) for name, pid in state["pids"].items()})
            raise ui.UIError(f"{url} did not answer (injected)", 1)

    monkeypatch.setattr(ui, "_wait_http", prefect_fails_when_mlflow_is_up)
    shm = shm_folders()
    with pytest.raises(ui.UIError) as e:
        ui.start(tmp_path, prefect_port=free_port(), mlflow_port=free_port(), serve=False, timeout_s=120)
    assert e.value.code == 1 and "injected" in str(e.value)
    assert len(seen["mlflow"]) >= 2 and seen["prefect"]              # the MLflow server and its uvicorn worker
    assert processes_in(tmp_path) == []                             # all of them stopped, none orphaned
    assert not any(ui.process_alive(p) for tree in seen.values() for p in tree)
    assert not (tmp_path / ".ui" / "state.json").exists() and not (tmp_path / ".ui" / "env").exists()
    assert {d for d in shm_folders() - shm if d.startswith("tmp")} == set()


ESCAPES = textwrap.dedent("""
    import subprocess, sys, time
    # a server that forks a worker into a session of its own and lets it be re-parented to init
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    print("forked", flush=True)
    time.sleep(300)
""")


def test_stop_finds_a_process_that_left_the_tree_by_its_mark(tmp_path):
    """A grandchild in its own session, whose parent died, is outside every process tree and group:
    ``stop`` still finds it by the ``MIMESIS_UI_ROOT`` mark in its environment."""
    (tmp_path / ".ui").mkdir()
    env = {**os.environ, ui.UI_MARK: str(tmp_path.resolve())}
    proc = subprocess.Popen([sys.executable, "-c", ESCAPES], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "forked"
    deadline = time.time() + 10
    while len(ui.marked_processes(tmp_path)) < 2 and time.time() < deadline:
        time.sleep(0.05)
    marked = ui.marked_processes(tmp_path)
    assert proc.pid in marked and len(marked) == 2, marked
    worker = next(p for p in marked if p != proc.pid)
    ui._write_state(tmp_path, {"pids": {}})           # the server itself already gone from the state
    proc.kill()
    proc.wait()
    proc.stdout.close()
    assert ui.process_alive(worker) and worker not in ui.process_tree(proc.pid)
    ui.stop(tmp_path, grace_s=2)
    assert not ui.process_alive(worker) and ui.marked_processes(tmp_path) == []


@pytest.mark.long
@pytest.mark.timeout(240)
def test_a_real_start_stop_cycle_leaves_nothing_behind(tmp_path, capsys):
    shm = shm_folders()
    ports = {"prefect": free_port(), "mlflow": free_port()}
    t0 = time.perf_counter()
    state = ui.start(tmp_path, prefect_port=ports["prefect"], mlflow_port=ports["mlflow"], serve=False,
                     timeout_s=150)
    try:
        print(f"[ui] both servers up in {time.perf_counter() - t0:.1f} s")
        assert state["ports"] == ports and state["mlflow_ui"] == f"http://127.0.0.1:{ports['mlflow']}"
        for name, port in ports.items():                            # the answering servers are the ones started
            assert ui.port_owner(port) in ui.process_tree(state["pids"][name])
        mlflow_cmds = [Path(f"/proc/{p}/cmdline").read_bytes() for p in ui.process_tree(state["pids"]["mlflow"])]
        assert not any(b"huey" in c or b"_job_runner" in c for c in mlflow_cmds), mlflow_cmds
        assert (tmp_path / ".ui" / "env").read_text().startswith(f"export PREFECT_API_URL={state['prefect_api']}")
        # started again: already running (non-zero), also when asked to move to other ports
        assert ui.main(["start", "--root", str(tmp_path), "--no-serve"]) == 3
        assert "already running" in capsys.readouterr().err
        assert ui.main(["start", "--root", str(tmp_path), "--mlflow-port", str(free_port()), "--no-serve"]) == 3
        assert "cannot move" in capsys.readouterr().err
        assert ui.status(tmp_path)["alive"] == {"prefect": True, "mlflow": True}
    finally:
        stopped = ui.stop(tmp_path)
    assert sorted(stopped) == ["mlflow", "prefect"]
    assert processes_in(tmp_path) == []
    assert all(ui.port_free("127.0.0.1", p) for p in ports.values())
    assert not (tmp_path / ".ui" / "state.json").exists() and not (tmp_path / ".ui" / "env").exists()
    assert {d for d in shm_folders() - shm if d.startswith("tmp")} == set()      # MLflow's job-queue folder
    assert ui.stop(tmp_path) == []
