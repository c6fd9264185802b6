"""One Prefect API server for a whole ``dvc repro``, instead of a temporary server per flow run.

Without ``PREFECT_API_URL`` Prefect starts a temporary server for every flow run (about 9 s each on
2 CPU cores; nine flows in the default pipeline). :func:`use_shared_server` gives the flow runs of one
project one server instead:

1. ``PREFECT_API_URL`` set by the user: used as is, nothing is started.
2. The project's UI runs (``make ui``, :mod:`flows.ui`) and answers: its API is used, so flow runs show
   up live in the UI.
3. Otherwise a shared server is started on demand on 127.0.0.1 (a free port) by a small supervisor
   (``python -m flows.prefect_api serve``), or reused when one started by an earlier stage still answers.
   There is one shared server per Prefect home (``PREFECT_HOME``, ``<root>/.prefect`` unless set): the
   database the temporary servers wrote to, so the UI sees every past run. Each flow process holds a lease
   (``$PREFECT_HOME/shared_api/leases/<pid>``) while it runs;
   the supervisor stops the server when no live process has held a lease for ``idle_s`` seconds
   (``MIMESIS_PREFECT_IDLE_S``, default 120): long enough to bridge the data stages between two flows
   of one ``dvc repro``, short enough that nothing lingers after it.

``MIMESIS_PREFECT_SERVER=ephemeral`` turns this off (a temporary server per flow run, Prefect's own
default). ``python -m flows.prefect_api status|stop`` shows or stops the shared server.

The server is started under an exclusive file lock, so concurrent stages (``dvc repro`` of independent
stages, or two shells) share one server rather than race to start two.

:func:`prestart` starts it in the background without waiting (the data stages call it when they run under
``dvc repro``, ``DVC_STAGE`` set), so that the server's start (about 18 s on 2 CPU cores) overlaps the data
stages instead of delaying the first flow; a flow that finds it still starting waits for it rather than
starting a second one. A prestarted server that no flow uses stops after ``idle_s``.
``MIMESIS_PREFECT_PRESTART=0`` turns the background start off; ``python -m flows.prefect_api prestart`` runs it.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from mimesis_lab.tracking import process_alive, process_identity
from mimesis_lab.train.launch import free_port

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_IDLE_S = 120.0
START_TIMEOUT_S = 120.0
HOST = "127.0.0.1"

__all__ = ["use_shared_server", "shared_server", "prestart", "prefect_home", "server_dir", "status", "stop",
           "main"]

#: The global concurrency limit every training run holds (the phase deployments of flows.serve, the chains of
#: flows.seeds): two trainings never share the CPU cores.
TRAINING_LIMIT = "mimesis-training"


def prefect_home() -> Path:
    """The Prefect home of this process (``PREFECT_HOME``, else ``<root>/.prefect``)."""
    return Path(os.environ.get("PREFECT_HOME") or ROOT / ".prefect").resolve()


def server_dir(home: Path) -> Path:
    return Path(home) / "shared_api"


def _state_path(home: Path) -> Path:
    return server_dir(home) / "state.json"


def _read_state(home: Path) -> dict:
    try:
        return json.loads(_state_path(home).read_text())
    except (OSError, ValueError):
        return {}


def _healthy(api_url: str, timeout_s: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout_s) as r:
            return r.status == 200
    except Exception:
        return False


def _live_state(home: Path) -> dict:
    """The shared server's state when its supervisor runs and the API answers, else ``{}``."""
    state = _read_state(home)
    if state.get("api_url") and process_alive(state["pid"], state.get("started", "")) and _healthy(state["api_url"]):
        return state
    return {}


def _starting(home: Path) -> dict:
    """A supervisor being started (its marker, younger than ``START_TIMEOUT_S``) or started whose server
    does not answer yet (``{}`` if none)."""
    state = _read_state(home)
    if state.get("starting") and time.time() - float(state.get("since", 0)) < START_TIMEOUT_S:
        return state
    if state.get("pid") and process_alive(state["pid"], state.get("started", "")):
        return state
    return {}


def _ui_api(root: Path) -> str | None:
    """The API of the project's running UI (``make ui``), when it answers."""
    try:
        state = json.loads((Path(root) / ".ui" / "state.json").read_text())
    except (OSError, ValueError):
        return None
    pid = state.get("pids", {}).get("prefect")
    api = state.get("prefect_api")
    if pid and api and process_alive(pid, state.get("started", {}).get("prefect", "")) and _healthy(api):
        return api
    return None


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    d = server_dir(home)
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _take_lease(home: Path) -> None:
    leases = server_dir(home) / "leases"
    leases.mkdir(parents=True, exist_ok=True)
    lease = leases / str(os.getpid())
    lease.write_text(process_identity(os.getpid())["mimesis.pid_started"])

    def _release() -> None:
        with contextlib.suppress(OSError):
            lease.unlink()
    atexit.register(_release)


def _spawn(home: Path, idle_s: float) -> tuple[int, subprocess.Popen]:
    """Start the supervisor (which starts the server) without waiting; ``(port, process)``. A marker naming
    the port is written first (the caller holds the lock), so no other process starts a second server while
    this one starts; the supervisor replaces it with its state."""
    d = server_dir(home)
    log = d / "server.log"
    port = free_port()
    tmp = d / "state.json.tmp"
    tmp.write_text(json.dumps({"starting": True, "port": port, "since": time.time()}))
    tmp.replace(_state_path(home))
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "")
                                                                                 .split(os.pathsep))]))}
    env.pop("PREFECT_API_URL", None)
    with open(log, "ab") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "flows.prefect_api", "serve", "--home", str(home), "--port",
                                 str(port), "--idle-s", str(idle_s)], cwd=ROOT, env=env, stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return port, proc


def _wait_ready(home: Path, port: int, proc: subprocess.Popen | None = None,
                timeout_s: float = START_TIMEOUT_S) -> dict:
    """Wait until the server started on ``port`` answers; its state. ``{}`` when its start was given up by
    another process (the state names another port, or none); an error when ``proc`` (our own supervisor)
    exits or the wait times out."""
    log = server_dir(home) / "server.log"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
            raise RuntimeError(f"the shared Prefect server exited with code {proc.returncode}; log {log}:\n{tail}")
        state = _read_state(home)
        if state.get("port") != port:
            return {}
        if state.get("api_url") and _healthy(state["api_url"]):
            return state
        if not state.get("starting") and not process_alive(state.get("pid", -1), state.get("started", "")):
            return {}                                   # its supervisor ended without a server
        time.sleep(0.5)
    if proc is not None:
        _terminate(proc.pid)
        raise RuntimeError(f"the shared Prefect server did not answer within {timeout_s:.0f} s; log {log}")
    return {}


def _start(home: Path, idle_s: float) -> dict:
    """Start the supervisor (which starts the server) and wait until the API answers."""
    port, proc = _spawn(home, idle_s)
    return _wait_ready(home, port, proc)


def _target(home: Path | None, idle_s: float | None) -> tuple[Path, str | None, float]:
    """``(Prefect home, the project's running UI API or None, idle_s)`` of a server request."""
    home = prefect_home() if home is None else Path(home).resolve()
    ui = _ui_api(ROOT) if home == (ROOT / ".prefect").resolve() else None
    idle_s = float(os.environ.get("MIMESIS_PREFECT_IDLE_S", DEFAULT_IDLE_S)) if idle_s is None else idle_s
    return home, ui, idle_s


def _disabled() -> bool:
    return bool(os.environ.get("PREFECT_API_URL")) or os.environ.get("MIMESIS_PREFECT_SERVER", "shared") == "ephemeral"


def prestart(home: Path | None = None, idle_s: float | None = None) -> bool:
    """Start the shared server in the background when none runs or starts (module docstring); True when this
    call started one. Nothing when the server is off (``PREFECT_API_URL``, ``ephemeral``), when the project's UI
    answers, or with ``MIMESIS_PREFECT_PRESTART=0``."""
    if _disabled() or os.environ.get("MIMESIS_PREFECT_PRESTART", "1") == "0":
        return False
    home, ui, idle_s = _target(home, idle_s)
    if ui:
        return False
    with _locked(home):
        if _starting(home):
            return False
        _spawn(home, idle_s)
    return True


def use_shared_server(home: Path | None = None, idle_s: float | None = None) -> str | None:
    """The Prefect API URL this process's flow runs should report to (module docstring), starting the
    shared server when needed, and a lease on it for this process's lifetime. ``None`` means "let Prefect
    decide" (``PREFECT_API_URL`` is set, or ``MIMESIS_PREFECT_SERVER=ephemeral``)."""
    if _disabled():
        return None
    home, ui, idle_s = _target(home, idle_s)
    if ui:
        return ui
    with _locked(home):
        state = _live_state(home)
        if not state:
            starting = _starting(home)        # a prestarted server: wait for it rather than start a second
            state = (_wait_ready(home, starting["port"]) if starting else {}) or _start(home, idle_s)
        _take_lease(home)     # under the lock: the supervisor cannot decide "idle" between start and lease
    return state["api_url"]


@contextlib.contextmanager
def shared_server(home: Path | None = None) -> Iterator[str | None]:
    """Run the enclosed flow calls against :func:`use_shared_server`'s API (Prefect settings are fixed at
    import, so the URL is applied with ``temporary_settings``, not through the environment)."""
    url = use_shared_server(home)
    if url is None:
        yield None
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    os.environ["PREFECT_API_URL"] = url          # for subprocesses this flow starts
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    finally:
        os.environ.pop("PREFECT_API_URL", None)


# ----------------------------------------------------------------------------- the supervisor
def _live_leases(home: Path) -> int:
    n = 0
    for lease in (server_dir(home) / "leases").glob("*"):
        try:
            alive = process_alive(int(lease.name), lease.read_text().strip())
        except (ValueError, OSError):
            alive = False
        if alive:
            n += 1
        else:
            with contextlib.suppress(OSError):
                lease.unlink()
    return n


def _terminate(pid: int, grace_s: float = 10.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.time() + grace_s
        while time.time() < deadline:
            if not process_alive(pid):
                return
            time.sleep(0.2)


def serve(home: Path, port: int, idle_s: float, poll_s: float = 1.0) -> int:
    """The supervisor: start ``prefect server start`` on 127.0.0.1:``port``, record the state, stop the
    server after ``idle_s`` seconds without a live lease (or on SIGTERM)."""
    home = Path(home).resolve()
    d = server_dir(home)
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_API_URL": f"http://{HOST}:{port}/api"}
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", HOST, "--port", str(port)],
                              cwd=ROOT, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    api = f"http://{HOST}:{port}/api"
    state = {"pid": os.getpid(), "started": process_identity(os.getpid())["mimesis.pid_started"],
             "server_pid": server.pid, "port": port, "api_url": api, "ui_url": f"http://{HOST}:{port}",
             "idle_s": idle_s}
    tmp = d / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(_state_path(home))
    last_busy = time.time()
    ready = False
    reason = "signal"
    try:
        while not stopping:
            if server.poll() is not None:
                reason = f"server exited with code {server.returncode}"
                break
            if not ready:                          # the idle clock starts once the API answers
                ready = _healthy(api)
                last_busy = time.time()
            elif _live_leases(home):
                last_busy = time.time()
            elif time.time() - last_busy > idle_s:
                reason = f"idle for {idle_s:.0f} s"
                break
            time.sleep(poll_s)
    finally:
        with _locked(home):
            if _read_state(home).get("pid") == os.getpid():
                with contextlib.suppress(OSError):
                    _state_path(home).unlink()
        _terminate(server.pid)
        print(f"shared Prefect server on {api} stopped: {reason}", flush=True)
    return 0


def status(home: Path | None = None) -> dict:
    home = prefect_home() if home is None else Path(home).resolve()
    state = _read_state(home)
    return {**state, "alive": bool(_live_state(home))} if state else {"alive": False}


def stop(home: Path | None = None) -> bool:
    """Stop the shared server (its supervisor), if one runs. True when one was stopped."""
    state = _read_state(prefect_home() if home is None else Path(home).resolve())
    if not state.get("pid") or not process_alive(state["pid"], state.get("started", "")):
        return False
    _terminate(state["pid"])
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flows.prefect_api", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sv = sub.add_parser("serve", help="(internal) the supervisor started by use_shared_server")
    sv.add_argument("--home", required=True)
    sv.add_argument("--port", type=int, required=True)
    sv.add_argument("--idle-s", type=float, default=DEFAULT_IDLE_S)
    for name in ("status", "stop", "prestart"):
        sub.add_parser(name).add_argument("--home", default=None, help="Prefect home (default: PREFECT_HOME or .prefect)")
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        return serve(Path(args.home), args.port, args.idle_s)
    if args.cmd == "prestart":
        print("starting" if prestart(args.home and Path(args.home)) else "not started (running, starting or off)")
        return 0
    if args.cmd == "status":
        print(json.dumps(status(args.home and Path(args.home)), indent=2))
        return 0
    print("stopped" if stop(args.home and Path(args.home)) else "no shared Prefect server runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
