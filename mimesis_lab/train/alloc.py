"""glibc ``malloc`` settings for the CPU jobs: keep freed memory instead of handing it back to the kernel.

With glibc's defaults a block above the (dynamic) mmap threshold is ``mmap``-ed and unmapped again on free,
and the heap top above 128 KiB is trimmed: every step of a small torch model on CPU then re-faults the same
tensor-sized buffers page by page (the committed run's ``agent_grpo``: 12 M minor page faults, a sixth of its
CPU time in the kernel). :data:`MALLOC_ENV` keeps blocks up to 32 MiB on the heap, trims only beyond 1 GiB of
free top and grows the heap 256 MiB at a time. Same numbers, bit for bit; the jobs run ~10% faster on 2
cores (``python bench/bench_malloc.py``; README "Benchmarks").

Jobs get the variables in their environment (:func:`mimesis_lab.train.launch.job_env`, read by glibc at the
process start); a process that is already running (the evaluation flows, which generate in-process) applies
them with ``mallopt`` (:func:`tune_process`). A variable already set wins; ``MIMESIS_MALLOC_TUNING=0`` turns
both off. Elsewhere than glibc nothing happens.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Mapping, MutableMapping

__all__ = ["MALLOC_ENV", "SWITCH_ENV", "enabled", "setdefault_env", "tune_process"]

#: glibc tunables (``man 3 mallopt``) and the values the jobs run with.
MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
    "MALLOC_TOP_PAD_": str(256 << 20),
}
#: ``mallopt`` parameter numbers of the variables above (malloc.h: M_TRIM_THRESHOLD -1, M_TOP_PAD -2,
#: M_MMAP_THRESHOLD -3).
_MALLOPT_PARAM = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_TOP_PAD_": -2, "MALLOC_MMAP_THRESHOLD_": -3}
#: ``0`` turns the tuning off (jobs and flows).
SWITCH_ENV = "MIMESIS_MALLOC_TUNING"


def enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(SWITCH_ENV, "1") != "0"


def setdefault_env(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Add :data:`MALLOC_ENV` to a job's environment ``env`` where not already set (in place; returned)."""
    if enabled(env):
        for key, value in MALLOC_ENV.items():
            env.setdefault(key, value)
    return env


def tune_process(env: Mapping[str, str] | None = None) -> dict[str, int]:
    """Apply :data:`MALLOC_ENV` to this running process with glibc's ``mallopt``; the variables already in
    ``env`` (``os.environ``) are skipped, glibc read those at the start. Returns what was applied (empty when
    turned off, not glibc, or nothing left to apply)."""
    env = os.environ if env is None else env
    if not enabled(env):
        return {}
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return {}
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    applied = {}
    for key, value in MALLOC_ENV.items():
        if key not in env and mallopt(_MALLOPT_PARAM[key], int(value)) == 1:
            applied[key] = int(value)
    return applied
