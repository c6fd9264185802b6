"""mimesis_lab/fast_exit.py: a fast exit keeps the exit status, the atexit handlers, the non-daemon threads'
work and unflushed file contents; MIMESIS_FAST_EXIT=0 falls back to sys.exit."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import atexit, sys, threading, time
sys.path.insert(0, {root!r})
from mimesis_lab.fast_exit import exit_now
out = {out!r}
f = open(out + "/open.txt", "w")               # never closed: its buffer is flushed by exit_now
f.write("x" * 1000)
atexit.register(lambda: open(out + "/atexit.txt", "w").write("ran"))
def later():
    time.sleep(0.3)
    open(out + "/thread.txt", "w").write("joined")
threading.Thread(target=later).start()        # non-daemon: waited for, as at a normal exit
print("to stdout", end="")                     # no newline: flushed at exit
exit_now(3)
"""


def _run(tmp_path, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-c", SCRIPT.format(root=str(ROOT), out=str(tmp_path))],
                          capture_output=True, text=True, env=env, timeout=60)


def test_exit_now_keeps_status_files_threads_and_atexit(tmp_path):
    res = _run(tmp_path)
    assert res.returncode == 3, res.stderr
    assert res.stdout == "to stdout"
    assert (tmp_path / "open.txt").read_text() == "x" * 1000
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    assert (tmp_path / "thread.txt").read_text() == "joined"


def test_exit_now_disabled_is_sys_exit(tmp_path):
    res = _run(tmp_path, {"MIMESIS_FAST_EXIT": "0"})
    assert res.returncode == 3 and res.stdout == "to stdout"
    assert (tmp_path / "open.txt").read_text() == "x" * 1000 and (tmp_path / "thread.txt").exists()


def test_exit_now_none_is_zero(tmp_path):
    script = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from mimesis_lab.fast_exit import exit_now; exit_now(None)"
    assert subprocess.run([sys.executable, "-c", script], timeout=60).returncode == 0
