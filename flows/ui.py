"""One command for the UIs: a Prefect server (with the deployments served) and an MLflow server over
the project's own stores, on 127.0.0.1.

    python -m flows.ui start [--prefect-port 4200] [--mlflow-port 5000] [--no-serve] [--host 127.0.0.1]
    python -m flows.ui status
    python -m flows.ui stop

(``make ui`` / ``make ui-stop``.) The Prefect server uses ``PREFECT_HOME=<root>/.prefect`` — the
database every flow run of ``dvc repro`` writes to — so past runs show up in its UI; MLflow serves
``mlflow/mlflow.db`` and ``mlflow/artifacts``. Processes run in their own sessions (they outlive
this command); pids, ports and logs are in ``<root>/.ui/``. ``start`` waits until both servers answer
their health checks *from the processes it started*, writes ``.ui/env`` (``PREFECT_API_URL``,
``MIMESIS_MLFLOW_UI``: ``source .ui/env`` before ``dvc repro`` to report flow runs to the running server)
and prints the URLs.

``start`` refuses, with a non-zero exit (:class:`UIError`) and a message that says why:

- **3** — this project's UI already runs (its ``.ui/state.json`` names live processes, or a process of
  this project answers on the port): ``make ui-stop`` first, also to move it to other ports;
- **4** — a port given explicitly (``--prefect-port``/``--mlflow-port``, ``PREFECT_PORT=``/``MLFLOW_PORT=``
  in make, ``MIMESIS_PREFECT_PORT``/``MIMESIS_MLFLOW_PORT``) is taken by another process, named with its
  pid and project folder (another clone's UI, say). Without explicit ports it takes 4200/5000, or the
  next free port above, and says so;
- **1** — a server did not come up (its log tail is printed). Every process it started is stopped.

``stop`` sends SIGTERM to each recorded process group and every descendant (collected before the first
signal, so none escapes by being re-parented) and to every process whose environment carries
``MIMESIS_UI_ROOT=<root>`` (set for every server, so a process forked late or in a session of its own is
found too), SIGKILL after a grace period, and removes what the
servers leave behind: ``.ui/state.json``, ``.ui/env`` and a temporary folder MLflow may create in
``/dev/shm`` (its job runner's queue; the UI starts MLflow with ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``,
so neither the folder nor the runner's seven ``huey`` consumers exist in the first place).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from mimesis_lab.tracking import process_alive, process_identity

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ("prefect", "mlflow", "serve")
DEFAULT_PORTS = {"prefect": 4200, "mlflow": 5000}
PORT_SEARCH = 100                          # how far above a busy default port to look for a free one
HUEY_ENV = "_MLFLOW_HUEY_STORAGE_PATH"     # MLflow's job-queue folder (in /dev/shm when it exists)
UI_MARK = "MIMESIS_UI_ROOT"                # set in every server's environment: ``stop`` finds all of them by it


class UIError(RuntimeError):
    """``start`` refused or failed; ``code`` is the exit status (module docstring)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def _ui_dir(root: Path) -> Path:
    d = root / ".ui"
    d.mkdir(exist_ok=True)
    return d


def _read_state(root: Path) -> dict:
    f = root / ".ui" / "state.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def _write_state(root: Path, state: dict) -> None:
    (_ui_dir(root) / "state.json").write_text(json.dumps(state, indent=2))


# ----------------------------------------------------------------------------- processes and ports
def _children() -> dict[int, list[int]]:
    """ppid -> child pids of every process visible in /proc."""
    out: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out.setdefault(ppid, []).append(int(d.name))
    return out


def marked_processes(root: Path) -> list[int]:
    """Pids of the processes that carry ``MIMESIS_UI_ROOT=<root>`` in their environment: every server
    ``start`` spawned and everything those spawned, re-parented or in a session of its own included."""
    mark = f"{UI_MARK}={Path(root).resolve()}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if mark in (d / "environ").read_bytes().split(b"\0"):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (alive now), parents first."""
    kids, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop(0)
        if p not in out and (p != pid or process_alive(p)):
            out.append(p)
            todo += kids.get(p, [])
    return out


def port_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now (SO_REUSEADDR, as the servers bind)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:   # 0A = LISTEN
                inodes.add(f[9])
    return inodes


def port_owner(port: int) -> int | None:
    """The pid of a process listening on ``port`` (``None`` if none, or not visible to this user)."""
    inodes = {f"socket:[{i}]" for i in _listening_inodes(port)}
    if not inodes:
        return None
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (d / "fd").iterdir()):
                return int(d.name)
        except OSError:
            continue
    return None


def _describe(pid: int | None) -> tuple[str, Path | None]:
    """``("pid N (<cmd>) in <folder>", folder)`` of a process."""
    if pid is None:
        return "a process this user cannot see", None
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return f"pid {pid}", None
    return f"pid {pid} ({cmd[:100]}) in {cwd}", cwd


def _pick_port(root: Path, host: str, name: str, port: int | None) -> int:
    """The port for service ``name``: ``port`` if given and free (else :class:`UIError`), or the
    default, or the next free one above it."""
    explicit = port is not None
    want = port if explicit else DEFAULT_PORTS[name]
    for p in ([want] if explicit else range(want, want + PORT_SEARCH)):
        if port_free(host, p):
            if p != want:
                print(f"{name}: port {want} is taken by {_describe(port_owner(want))[0]}; using {p}")
            return p
        who, cwd = _describe(port_owner(p))
        if cwd is not None and cwd.resolve() == root.resolve():
            raise UIError(f"a UI of this project already answers on port {p} ({who}) but .ui/state.json does not "
                          "record it: stop that process first", 3)
        if explicit:
            raise UIError(f"{name} port {p} is taken by {who}. Choose free ports, e.g. `make ui PREFECT_PORT=4300 "
                          "MLFLOW_PORT=5300`, or stop that UI (in its project: `make ui-stop`).", 4)
    raise UIError(f"no free {name} port in {want}..{want + PORT_SEARCH - 1}", 4)


def _wait_http(url: str, port: int, timeout_s: float, proc: subprocess.Popen, log: Path) -> None:
    """Wait until ``url`` answers and the listener on ``port`` is ``proc`` or one of its descendants."""
    deadline = time.time() + timeout_s
    last = None
    while time.time() < deadline:
        if proc.poll() is not None:
            tail = log.read_text()[-3000:] if log.is_file() else ""
            raise UIError(f"{url}: the server exited with code {proc.returncode}\n{tail}", 1)
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status < 500:
                    owner = port_owner(port)
                    if owner in process_tree(proc.pid):
                        return
                    raise UIError(f"{url} answers, but from {_describe(owner)[0]}, not from the server started here "
                                  f"(pid {proc.pid})", 4)
        except UIError:
            raise
        except Exception as e:   # not up yet
            last = e
        time.sleep(1.0)
    raise UIError(f"{url} did not answer within {timeout_s:.0f} s ({last}); log: {log}", 1)


def _spawn(name: str, cmd: list[str], root: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(_ui_dir(root) / f"{name}.log", "ab") as fh:
        return subprocess.Popen(cmd, cwd=root, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _alive(state: dict, name: str) -> bool:
    """Whether the recorded process ``name`` still runs (and is the one recorded, not a reused pid)."""
    pid = state.get("pids", {}).get(name)
    return pid is not None and process_alive(pid, state.get("started", {}).get(name, ""))


def _record(root: Path, state: dict, name: str, proc: subprocess.Popen) -> None:
    state["pids"][name] = proc.pid
    state.setdefault("started", {})[name] = process_identity(proc.pid)["mimesis.pid_started"]
    _write_state(root, state)


def _ports(state: dict) -> dict[str, int]:
    return state.get("ports") or {k: int(state[f"{k}_ui"].rsplit(":", 1)[1]) for k in DEFAULT_PORTS
                                  if f"{k}_ui" in state}


# ----------------------------------------------------------------------------- start / stop / status
def start(root: Path = ROOT, host: str = "127.0.0.1", prefect_port: int | None = None,
          mlflow_port: int | None = None, serve: bool = True, timeout_s: float = 180.0) -> dict:
    """Start the servers; returns the state (urls, ports, pids). Raises :class:`UIError` (module docstring)."""
    root = root.resolve()
    state = _read_state(root)
    pids = state.get("pids", {})
    if pids and all(_alive(state, name) for name in pids):
        running = _ports(state)
        asked = {k: p for k, p in (("prefect", prefect_port), ("mlflow", mlflow_port)) if p is not None}
        moved = {k: p for k, p in asked.items() if running.get(k) != p}
        if moved:
            raise UIError(f"the UI of this project runs on ports prefect={running.get('prefect')} "
                          f"mlflow={running.get('mlflow')}; it cannot move to {moved} while running: "
                          "`make ui-stop` first", 3)
        raise UIError(f"the UI of this project is already running: Prefect {state['prefect_ui']}, MLflow "
                      f"{state['mlflow_ui']} (stop: `make ui-stop`)", 3)
    if pids:
        print(f"cleaning up a UI that half-died: {stop(root)}")
    ports = {"prefect": _pick_port(root, host, "prefect", prefect_port)}
    ports["mlflow"] = _pick_port(root, host, "mlflow", mlflow_port)
    if ports["prefect"] == ports["mlflow"]:
        raise UIError(f"Prefect and MLflow cannot share port {ports['prefect']}", 4)
    py = sys.executable
    bindir = str(Path(py).parent)
    prefect_api = f"http://{host}:{ports['prefect']}/api"
    mlflow_url = f"http://{host}:{ports['mlflow']}"
    env = {**os.environ, "PREFECT_HOME": str(root / ".prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    env.pop("PREFECT_API_URL", None)
    env[UI_MARK] = str(root)
    env["PREFECT_UI_API_URL"] = prefect_api          # the UI's browser code calls this API (default :4200)
    (root / ".prefect").mkdir(exist_ok=True)
    (root / "mlflow" / "artifacts").mkdir(parents=True, exist_ok=True)
    state = {"root": str(root), "prefect_ui": f"http://{host}:{ports['prefect']}", "prefect_api": prefect_api,
             "mlflow_ui": mlflow_url, "ports": ports, "pids": {}}
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["prefect"] = _spawn("prefect", [py, "-m", "prefect", "server", "start", "--host", host, "--port",
                                              str(ports["prefect"])], root, env)
        _record(root, state, "prefect", procs["prefect"])   # recorded at once: a failure below stops it
        procs["mlflow"] = _spawn("mlflow", [py, "-m", "mlflow", "server", "--backend-store-uri",
                                            f"sqlite:///{root / 'mlflow' / 'mlflow.db'}", "--default-artifact-root",
                                            str(root / "mlflow" / "artifacts"), "--host", host, "--port",
                                            str(ports["mlflow"]), "--workers", "1"], root,
                                 {**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        _record(root, state, "mlflow", procs["mlflow"])
        _wait_http(f"{prefect_api}/health", ports["prefect"], timeout_s, procs["prefect"], root / ".ui" / "prefect.log")
        _wait_http(f"{mlflow_url}/health", ports["mlflow"], timeout_s, procs["mlflow"], root / ".ui" / "mlflow.log")
        if serve:
            procs["serve"] = _spawn("serve", [py, "-m", "flows.serve"], root,
                                    {**env, "PREFECT_API_URL": prefect_api, "MIMESIS_MLFLOW_UI": mlflow_url,
                                     "PYTHONPATH": str(root)})
            _record(root, state, "serve", procs["serve"])
    except BaseException:
        stop(root)
        raise
    (root / ".ui" / "env").write_text(f"export PREFECT_API_URL={prefect_api}\nexport MIMESIS_MLFLOW_UI={mlflow_url}\n")
    return state


def _signal(pids: list[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _huey_dir(pid: int) -> Path | None:
    """The job-queue folder named in a process's environment (MLflow started with job execution)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(HUEY_ENV.encode() + b"="):
            return Path(item.split(b"=", 1)[1].decode())
    return None


def stop(root: Path = ROOT, grace_s: float = 10.0) -> list[str]:
    """Stop every recorded server with all its descendants (SIGTERM, SIGKILL after ``grace_s``) and remove
    ``.ui/state.json``, ``.ui/env`` and MLflow's ``/dev/shm`` queue folder; returns the names stopped."""
    root = root.resolve()
    state = _read_state(root)
    trees = {name: process_tree(pid) for name, pid in state.get("pids", {}).items() if _alive(state, name)}
    everyone = [p for tree in trees.values() for p in tree]
    everyone += [p for p in marked_processes(root) if p not in everyone]
    leftovers = {d for p in everyone if (d := _huey_dir(p)) is not None}
    for tree in trees.values():
        try:
            os.killpg(tree[0], signal.SIGTERM)      # start_new_session: each server leads its own group
        except (ProcessLookupError, PermissionError):
            pass
    _signal(everyone, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and any(process_alive(p) for p in everyone):
        time.sleep(0.2)
    _signal([p for p in everyone if process_alive(p)], signal.SIGKILL)
    for _ in range(50):          # a server may have forked while it was being stopped: those carry the mark too
        late = [p for p in marked_processes(root) if process_alive(p)]
        if not late:
            break
        leftovers |= {d for p in late if (d := _huey_dir(p)) is not None}
        _signal(late, signal.SIGKILL)
        time.sleep(0.1)
    for d in leftovers:
        if d.parent in (Path("/dev/shm"), Path(os.environ.get("TMPDIR", "/tmp"))) and d.name.startswith("tmp"):
            shutil.rmtree(d, ignore_errors=True)
    for f in ("state.json", "env"):
        (root / ".ui" / f).unlink(missing_ok=True)
    return list(trees)


def status(root: Path = ROOT) -> dict:
    state = _read_state(root.resolve())
    return {**state, "alive": {k: _alive(state, k) for k in state.get("pids", {})}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flows.ui", description="Start/stop the Prefect and MLflow UIs on 127.0.0.1.")
    ap.add_argument("action", choices=["start", "stop", "status"])
    ap.add_argument("--root", type=Path, default=ROOT, help="project root whose stores are served")
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")

    def env_port(name: str) -> int | None:
        return int(os.environ[name]) if os.environ.get(name) else None

    ap.add_argument("--prefect-port", type=int, default=env_port("MIMESIS_PREFECT_PORT"),
                    help="default 4200, or the next free port above it")
    ap.add_argument("--mlflow-port", type=int, default=env_port("MIMESIS_MLFLOW_PORT"),
                    help="default 5000, or the next free port above it")
    ap.add_argument("--no-serve", action="store_true", help="do not serve the Prefect deployments")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    if args.action == "start":
        try:
            s = start(root, args.host, args.prefect_port, args.mlflow_port, serve=not args.no_serve)
        except UIError as e:
            print(f"flows.ui start: {e}", file=sys.stderr)
            return e.code
        print(f"Prefect UI: {s['prefect_ui']}\nMLflow UI:  {s['mlflow_ui']}\n"
              f"logs: {root / '.ui'}/*.log   stop: python -m flows.ui stop")
    elif args.action == "stop":
        print("stopped: " + (", ".join(stop(root)) or "nothing was running"))
    else:
        print(json.dumps(status(root), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
