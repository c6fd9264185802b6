"""Launch a training phase as a distributed job: ``deepspeed``, ``torchrun`` or ``direct``, one machine.

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
- ``direct`` (N = 1 only): ``python -m JOB --phase PHASE --params PARAMS``, the job's one rank started
  without a launcher process (``RANK=0 WORLD_SIZE=1``, ``MASTER_PORT=P``), which saves the launcher's
  own start (bench/bench_overhead.py); DeepSpeed still does the training. A caller that has set-up work
  of its own before the job (the training flow creating the MLflow run) can :func:`prestart` it: the job's
  interpreter starts at once and imports its module meanwhile (:mod:`mimesis_lab.train.prestart`), and
  :func:`launch` with ``pending=`` hands it the rest of its environment and streams it as usual.

``JOB`` is the phase's recipe module (:data:`mimesis_lab.code_deps.JOB_MODULES`):
``mimesis_lab.jobs.sft`` for ``midtrain``/``sft``/``agent_sft``, ``mimesis_lab.jobs.<phase>`` otherwise.

The job runs in its own session (process group): :func:`kill_job` (used on timeout and
Ctrl-C) signals the launcher and all its ranks together. Multi-node runs use ``deepspeed
--hostfile`` directly (``configs/paper/README.md``).
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["LaunchError", "PendingJob", "free_port", "build_command", "job_env", "kill_job", "prestart", "launch", "main"]

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
    if launcher == "direct":
        if world_size != 1:
            raise ValueError(f"launcher 'direct' starts one process: world_size must be 1, got {world_size} "
                             "(use torchrun or deepspeed)")
        return [sys.executable, "-m", *job]
    raise ValueError(f"unknown launcher {launcher!r} (expected deepspeed | torchrun | direct)")


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
    if launcher == "direct":        # the rank's identity, which a launcher would set
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
            out.pop(key, None)      # never an outer job's
        out.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                    "MASTER_ADDR": "127.0.0.1"})
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
    """SIGTERM the job's process group, SIGKILL it after ``grace_s`` seconds.

    Only a job that leads its own process group (``start_new_session``, as :func:`launch` and
    :func:`prestart` start it) is signalled as a group; any other process is signalled alone. Signalling
    the group of a child that shares ours would kill the caller and everything beside it (a test run, its
    ``make``, the CI shell). A job already reaped is not signalled at all: its pid may be reused."""
    if proc.poll() is not None:
        return
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    own_group = pgid == proc.pid and pgid != os.getpgrp()
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            if own_group:
                os.killpg(pgid, sig)
            else:
                proc.send_signal(sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


PRESTART_ENV = "MIMESIS_JOB_PRESTART"


class PendingJob:
    """A ``direct`` job started by :func:`prestart`, waiting on stdin for its go (:func:`launch` gives it)."""

    def __init__(self, proc: subprocess.Popen, cmd: list[str], env: dict[str, str], key: tuple):
        self.proc, self.cmd, self.env, self.key = proc, cmd, env, key

    def go(self, env: Mapping[str, str]) -> None:
        """Send the environment difference (``env`` is the job's whole environment) and release the job."""
        assert self.proc.stdin is not None
        delta = {"set": {k: v for k, v in env.items() if self.env.get(k) != v},
                 "unset": [k for k in self.env if k not in env]}
        self.proc.stdin.write(json.dumps(delta) + "\n")
        self.proc.stdin.close()

    def cancel(self, grace_s: float = 5.0) -> None:
        """No go: close its stdin (it exits without running the job), kill it if it does not."""
        try:
            if self.proc.stdin and not self.proc.stdin.closed:
                self.proc.stdin.close()
            self.proc.wait(timeout=grace_s)
        except (subprocess.TimeoutExpired, OSError):
            kill_job(self.proc, grace_s=1.0)
        if self.proc.stdout:
            self.proc.stdout.close()


def prestart(phase: str, params_path: str | os.PathLike, world_size: int, launcher: str,
             env: Mapping[str, str] | None = None, *, cwd: str | os.PathLike | None = None) -> PendingJob | None:
    """Start a ``direct`` job's interpreter now (:mod:`mimesis_lab.train.prestart`: it imports the job's module
    and waits); pass it to :func:`launch` as ``pending=``. ``None`` for other launchers, or with
    ``MIMESIS_JOB_PRESTART=0``. ``env`` is what is known now; :func:`launch` sends what changed."""
    if launcher != "direct" or world_size != 1 or os.environ.get(PRESTART_ENV, "1") == "0":
        return None
    job = build_command(phase, params_path, world_size, launcher, 0)
    cmd = [sys.executable, "-m", "mimesis_lab.train.prestart", *job[2:]]
    penv = job_env(world_size, env, launcher)
    proc = subprocess.Popen(cmd, cwd=cwd, env=penv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True,
                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    return PendingJob(proc, job, penv, (phase, str(params_path), world_size, launcher, str(cwd or "")))


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
    pending: PendingJob | None = None,
) -> subprocess.CompletedProcess:
    """Run ``phase`` as a distributed job and wait for it.

    ``world_size`` / ``launcher`` default to ``params.<phase>.world_size`` / ``.launcher``. ``pending``: the
    same job started ahead by :func:`prestart` (released with ``env`` here; a pending job for other
    arguments is cancelled and the job started afresh).
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
    if pending is not None and pending.key != (phase, str(params_path), world_size, launcher, str(cwd or "")):
        pending.cancel()
        pending = None
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    log = open(log_path, "a", encoding="utf-8") if log_path else None
    if pending is not None:
        cmd, proc = pending.cmd, pending.proc
        try:
            pending.go(job_env(world_size, env, launcher))
        except OSError:                  # it died before its go: its output below says why
            pass
    else:
        cmd = build_command(phase, params_path, world_size, launcher, free_port())
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
    [--launcher deepspeed|torchrun|direct] [--log FILE]``: what a DVC stage or a flow runs."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mimesis_lab.train.launch", description=main.__doc__)
    ap.add_argument("--phase", required=True, choices=sorted(JOB_MODULES))
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--world-size", type=int, default=None, help="default: params.<phase>.world_size")
    ap.add_argument("--launcher", choices=["deepspeed", "torchrun", "direct"], default=None,
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
