"""Launch a training phase as a distributed job: ``deepspeed`` or ``torchrun``, one machine.

:func:`launch` builds the command line (:func:`build_command`), picks a free ``MASTER_PORT``,
sets the job environment (:func:`job_env`: ``DS_ACCELERATOR=cpu`` without CUDA for the ``deepspeed``
runner, ``OMP_NUM_THREADS = cores // world_size`` so ranks do not oversubscribe the CPU, the project
on ``PYTHONPATH``), streams the job's combined output line by line (echoed, kept as a tail,
optionally written to a log file), and turns a non-zero exit into :class:`LaunchError`
carrying the last lines of the log.

Commands (world size N, port P):

- ``deepspeed --num_nodes 1 --num_gpus N --master_addr 127.0.0.1 --master_port P --module
  JOB --phase PHASE --params PARAMS`` — on CPU ``--num_gpus`` means N local
  processes (the runner trims the localhost slots to ``range(N)``; ``LOCAL_SIZE=N`` is exported
  to the ranks).
- ``torchrun --nnodes 1 --nproc_per_node N --master_addr 127.0.0.1 --master_port P -m
  JOB --phase PHASE --params PARAMS``.

``JOB`` is the phase's recipe module (:data:`mimesis_lab.code_deps.JOB_MODULES`):
``mimesis_lab.jobs.sft`` for ``midtrain``/``sft``/``agent_sft``, ``mimesis_lab.jobs.<phase>`` otherwise.

The job runs in its own session (process group): :func:`kill_job` (used on timeout and
Ctrl-C) signals the launcher and all its ranks together. Multi-node runs use ``deepspeed
--hostfile`` directly (``configs/paper/README.md``).
"""
from __future__ import annotations

import collections
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["LaunchError", "free_port", "build_command", "job_env", "kill_job", "launch", "main"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
from mimesis_lab.code_deps import JOB_MODULES  # noqa: E402  (phase -> recipe module name)


class LaunchError(subprocess.CalledProcessError):
    """The training job exited non-zero; ``tail`` holds the last lines of its output."""

    def __init__(self, returncode: int, cmd: Sequence[str], tail: str):
        super().__init__(returncode, list(cmd), output=tail)
        self.tail = tail

    def __str__(self) -> str:
        how = f"killed by signal {-self.returncode}" if self.returncode < 0 else f"exit status {self.returncode}"
        return f"training job failed ({how}): {' '.join(self.cmd)}\n--- last lines of the job log ---\n{self.tail}"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (bind to port 0, release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _deepspeed_cli() -> list[str]:
    script = Path(sys.executable).with_name("deepspeed")
    if script.is_file():
        return [str(script)]
    found = shutil.which("deepspeed")
    return [found] if found else [sys.executable, "-m", "deepspeed.launcher.runner"]


def build_command(phase: str, params_path: str | os.PathLike, world_size: int, launcher: str,
                  master_port: int) -> list[str]:
    """The launcher command line for one machine with ``world_size`` processes."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if phase not in JOB_MODULES:
        raise ValueError(f"unknown phase {phase!r} (expected one of {sorted(JOB_MODULES)})")
    job = [JOB_MODULES[phase], "--phase", phase, "--params", str(params_path)]
    if launcher == "deepspeed":
        return [*_deepspeed_cli(), "--num_nodes", "1", "--num_gpus", str(world_size),
                "--master_addr", "127.0.0.1", "--master_port", str(master_port), "--module", *job]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(world_size),
                "--master_addr", "127.0.0.1", "--master_port", str(master_port), "-m", *job]
    raise ValueError(f"unknown launcher {launcher!r} (expected deepspeed | torchrun)")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return False


def job_env(world_size: int, env: Mapping[str, str] | None = None, launcher: str = "deepspeed") -> dict[str, str]:
    """``os.environ`` + ``env`` + the job defaults (each only where not already set). ``DS_ACCELERATOR=cpu``
    without CUDA only for the ``deepspeed`` launcher, whose runner picks the accelerator itself: under
    ``torchrun`` each rank sets it (:func:`mimesis_lab.train.runtime.job_main`), and the launching process
    does not import torch to look for CUDA (about 2 s of every job)."""
    out = dict(os.environ)
    out.update(env or {})
    if launcher == "deepspeed" and "DS_ACCELERATOR" not in out and not _has_cuda():
        out["DS_ACCELERATOR"] = "cpu"
    out.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
    out.setdefault("HF_HUB_OFFLINE", "1")
    out.setdefault("TRANSFORMERS_OFFLINE", "1")
    out["PYTHONUNBUFFERED"] = "1"
    py_path = [str(PROJECT_ROOT)] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(py_path))
    return out


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """``preexec_fn``: ask Linux to SIGTERM the job when the launching process dies (even by
    SIGKILL), so a killed flow or test never leaves a training job running in its own session."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except Exception:
        pass


def kill_job(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the job's process group, SIGKILL it after ``grace_s`` seconds."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def launch(
    phase: str,
    params_path: str | os.PathLike = "params.yaml",
    world_size: int | None = None,
    launcher: str | None = None,
    env: Mapping[str, str] | None = None,
    *,
    cwd: str | os.PathLike | None = None,
    log_path: str | os.PathLike | None = None,
    timeout_s: float | None = None,
    tail_lines: int = 60,
    echo: bool = True,
) -> subprocess.CompletedProcess:
    """Run ``phase`` as a distributed job and wait for it.

    ``world_size`` / ``launcher`` default to ``params.<phase>.world_size`` / ``.launcher``.
    Returns a ``CompletedProcess`` whose ``stdout`` is the tail of the output; raises
    :class:`LaunchError` (a ``CalledProcessError``) with that tail when the job fails or is
    killed (also on timeout).
    """
    if world_size is None or launcher is None:
        from mimesis_lab.config import load_params

        cfg = getattr(load_params(params_path), phase)
        if cfg is None:
            raise ValueError(f"{params_path}: no `{phase}` section")
        world_size = cfg.world_size if world_size is None else world_size
        launcher = cfg.launcher if launcher is None else launcher
    cmd = build_command(phase, params_path, world_size, launcher, free_port())
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    log = open(log_path, "a", encoding="utf-8") if log_path else None
    proc = subprocess.Popen(cmd, cwd=cwd, env=job_env(world_size, env, launcher), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True,
                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    timer = threading.Timer(timeout_s, kill_job, args=(proc,)) if timeout_s else None
    if timer:
        timer.daemon = True
        timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
            if log:
                log.write(line)
        rc = proc.wait()
    except BaseException:
        kill_job(proc)
        raise
    finally:
        if timer:
            timer.cancel()
        if log:
            log.close()
    text = "\n".join(tail)
    if rc != 0:
        raise LaunchError(rc, cmd, text)
    return subprocess.CompletedProcess(cmd, rc, stdout=text)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mimesis_lab.train.launch --phase midtrain [--params params.yaml] [--world-size N]
    [--launcher deepspeed|torchrun] [--log FILE]``: what a DVC stage or a flow runs."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mimesis_lab.train.launch", description=main.__doc__)
    ap.add_argument("--phase", required=True, choices=sorted(JOB_MODULES))
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--world-size", type=int, default=None, help="default: params.<phase>.world_size")
    ap.add_argument("--launcher", choices=["deepspeed", "torchrun"], default=None,
                    help="default: params.<phase>.launcher")
    ap.add_argument("--log", default=None, help="also append the job output to this file")
    args = ap.parse_args(argv)
    try:
        launch(args.phase, args.params, args.world_size, args.launcher, log_path=args.log)
    except LaunchError as e:
        print(f"error: training job failed ({e.returncode}); see the output above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
