"""Leave a finished process without the interpreter's teardown.

After ``main()`` returns, CPython waits for non-daemon threads, runs the ``atexit`` handlers (Prefect drains its
log and event workers there, ``logging`` flushes its handlers, MLflow and coverage finish), and then tears the
interpreter down: it clears every module and frees every object. With torch, transformers, DeepSpeed, Prefect
and MLflow loaded that last part alone takes about a second on 2 CPU cores (a ``report`` flow process: 5.5 s
with it, 4.6 s without, three runs each), and a ``dvc repro`` starts some thirty such processes (a stage, a
flow, a job). :func:`exit_now` does the first two steps as CPython does, flushes every open file object (the
teardown would have closed them), and then ends the process with ``os._exit``: the same exit status and the
same files, less the teardown. ``multiprocessing``'s child processes end the same way.

Only for a normal return: an exception still propagates with its traceback and CPython's own exit.
``MIMESIS_FAST_EXIT=0`` restores the normal exit (``sys.exit``) everywhere.
"""
from __future__ import annotations

import atexit
import gc
import io
import os
import sys
import threading
from typing import NoReturn

__all__ = ["exit_now", "enabled"]


def enabled() -> bool:
    return os.environ.get("MIMESIS_FAST_EXIT", "1") != "0"


def _flush_open_files() -> None:
    for obj in gc.get_objects():
        if isinstance(obj, io.IOBase):
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except (OSError, ValueError):    # a broken pipe, a detached buffer: nothing to save
                pass


def exit_now(code: int | None = 0) -> NoReturn:
    """End the process with status ``code`` (``None`` -> 0) after what a normal exit does first: join the
    non-daemon threads, run the ``atexit`` handlers, flush open files and the standard streams."""
    code = 0 if code is None else int(code)
    if not enabled():
        sys.exit(code)
    main = threading.main_thread()
    for t in threading.enumerate():
        if t is not main and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    _flush_open_files()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)
