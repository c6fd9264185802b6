"""One command for the UIs: a Prefect server (with the deployments served) and an MLflow server over
the project's own stores, on 127.0.0.1.

    python -m flows.ui start [--prefect-port 4200] [--mlflow-port 5000] [--no-serve] [--host 127.0.0.1]
    python -m flows.ui status
    python -m flows.ui stop

(``make ui`` / ``make ui-stop``.) The Prefect server uses ``PREFECT_HOME=<root>/.prefect`` — the
database every flow run of ``dvc repro`` writes to — so past runs show up in its UI; MLflow serves
``mlflow/mlflow.db`` and ``mlflow/artifacts``. Processes run in their own sessions (they outlive
this command); pids and logs are in ``<root>/.ui/``; ``stop`` sends SIGTERM to each process group
and SIGKILL after a grace period. ``start`` waits until both servers answer their health checks,
writes ``.ui/env`` (``PREFECT_API_URL``, ``MIMESIS_MLFLOW_UI``: ``source .ui/env`` before ``dvc
repro`` to report flow runs to the running server) and prints the URLs.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ("prefect", "mlflow", "serve")


def _ui_dir(root: Path) -> Path:
    d = root / ".ui"
    d.mkdir(exist_ok=True)
    return d


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:   # a zombie (exited, not reaped) is not alive
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return True


def _read_state(root: Path) -> dict:
    f = _ui_dir(root) / "state.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.time() + timeout_s
    last = None
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.is_file() else ""
            raise RuntimeError(f"{url}: the server exited with code {proc.returncode}\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status < 500:
                    return
        except Exception as e:   # not up yet
            last = e
        time.sleep(1.0)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s ({last})")


def _spawn(name: str, cmd: list[str], root: Path, env: dict[str, str]) -> subprocess.Popen:
    log = _ui_dir(root) / f"{name}.log"
    fh = open(log, "ab")
    return subprocess.Popen(cmd, cwd=root, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def start(root: Path = ROOT, host: str = "127.0.0.1", prefect_port: int = 4200, mlflow_port: int = 5000,
          serve: bool = True, timeout_s: float = 180.0) -> dict:
    """Start the servers (idempotent: running ones are kept); returns the state (urls, pids)."""
    state = _read_state(root)
    if state and all(_alive(p) for p in state.get("pids", {}).values()):
        return state
    stop(root)
    py = sys.executable
    bindir = str(Path(py).parent)
    prefect_api = f"http://{host}:{prefect_port}/api"
    mlflow_url = f"http://{host}:{mlflow_port}"
    env = {**os.environ, "PREFECT_HOME": str(root / ".prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    env.pop("PREFECT_API_URL", None)
    env["PREFECT_UI_API_URL"] = prefect_api          # the UI's browser code calls this API (default :4200)
    (root / ".prefect").mkdir(exist_ok=True)
    (root / "mlflow" / "artifacts").mkdir(parents=True, exist_ok=True)
    procs = {"prefect": _spawn("prefect", [py, "-m", "prefect", "server", "start", "--host", host, "--port",
                                           str(prefect_port)], root, env),
             "mlflow": _spawn("mlflow", [py, "-m", "mlflow", "server", "--backend-store-uri",
                                         f"sqlite:///{root / 'mlflow' / 'mlflow.db'}", "--default-artifact-root",
                                         str(root / "mlflow" / "artifacts"), "--host", host, "--port",
                                         str(mlflow_port), "--workers", "1"], root, env)}
    state = {"root": str(root), "prefect_ui": f"http://{host}:{prefect_port}", "prefect_api": prefect_api,
             "mlflow_ui": mlflow_url, "pids": {k: p.pid for k, p in procs.items()}}
    (_ui_dir(root) / "state.json").write_text(json.dumps(state, indent=2))
    try:
        _wait_http(f"{prefect_api}/health", timeout_s, procs["prefect"], _ui_dir(root) / "prefect.log")
        _wait_http(f"{mlflow_url}/health", timeout_s, procs["mlflow"], _ui_dir(root) / "mlflow.log")
        if serve:
            procs["serve"] = _spawn("serve", [py, "-m", "flows.serve"], root,
                                    {**env, "PREFECT_API_URL": prefect_api, "MIMESIS_MLFLOW_UI": mlflow_url,
                                     "PYTHONPATH": str(root)})
            state["pids"]["serve"] = procs["serve"].pid
    except BaseException:
        (_ui_dir(root) / "state.json").write_text(json.dumps(state, indent=2))
        stop(root)
        raise
    (_ui_dir(root) / "state.json").write_text(json.dumps(state, indent=2))
    (_ui_dir(root) / "env").write_text(f"export PREFECT_API_URL={prefect_api}\nexport MIMESIS_MLFLOW_UI={mlflow_url}\n")
    return state


def stop(root: Path = ROOT, grace_s: float = 10.0) -> list[str]:
    """Stop every recorded server (SIGTERM to its process group, SIGKILL after ``grace_s``)."""
    state = _read_state(root)
    stopped = []
    for name, pid in state.get("pids", {}).items():
        if not _alive(pid):
            continue
        try:
            pgid = os.getpgid(pid)
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.time() + grace_s
        while time.time() < deadline and _alive(pid):
            time.sleep(0.2)
        if _alive(pid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        stopped.append(name)
    f = _ui_dir(root) / "state.json"
    if f.is_file():
        f.unlink()
    return stopped


def status(root: Path = ROOT) -> dict:
    state = _read_state(root)
    return {**state, "alive": {k: _alive(p) for k, p in state.get("pids", {}).items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flows.ui", description="Start/stop the Prefect and MLflow UIs on 127.0.0.1.")
    ap.add_argument("action", choices=["start", "stop", "status"])
    ap.add_argument("--root", type=Path, default=ROOT, help="project root whose stores are served")
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    ap.add_argument("--prefect-port", type=int, default=int(os.environ.get("MIMESIS_PREFECT_PORT", 4200)))
    ap.add_argument("--mlflow-port", type=int, default=int(os.environ.get("MIMESIS_MLFLOW_PORT", 5000)))
    ap.add_argument("--no-serve", action="store_true", help="do not serve the Prefect deployments")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    if args.action == "start":
        s = start(root, args.host, args.prefect_port, args.mlflow_port, serve=not args.no_serve)
        print(f"Prefect UI: {s['prefect_ui']}\nMLflow UI:  {s['mlflow_ui']}\n"
              f"logs: {root / '.ui'}/*.log   stop: python -m flows.ui stop")
    elif args.action == "stop":
        print("stopped: " + (", ".join(stop(root)) or "nothing was running"))
    else:
        print(json.dumps(status(root), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
