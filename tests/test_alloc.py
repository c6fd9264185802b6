"""glibc malloc settings of the jobs and flows (mimesis_lab/train/alloc.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mimesis_lab.train.alloc import MALLOC_ENV, SWITCH_ENV, setdefault_env
from mimesis_lab.train.launch import job_env

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def clean_env(monkeypatch):
    for key in (*MALLOC_ENV, SWITCH_ENV):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_job_env_carries_the_malloc_settings_unless_set_or_turned_off(clean_env):
    env = job_env(1, None, "direct")
    assert {k: env[k] for k in MALLOC_ENV} == MALLOC_ENV
    assert MALLOC_ENV == {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1073741824",
                          "MALLOC_TOP_PAD_": "268435456"}
    mine = job_env(1, {"MALLOC_TOP_PAD_": "0"}, "direct")
    assert mine["MALLOC_TOP_PAD_"] == "0" and mine["MALLOC_TRIM_THRESHOLD_"] == "1073741824"   # the user's wins
    off = job_env(1, {SWITCH_ENV: "0"}, "direct")
    assert not set(MALLOC_ENV) & set(off)
    clean_env.setenv(SWITCH_ENV, "0")                   # turned off in the flow's own environment
    assert not set(MALLOC_ENV) & set(job_env(2))
    assert setdefault_env({SWITCH_ENV: "1"}) == {SWITCH_ENV: "1", **MALLOC_ENV}


def _tune_in_subprocess(env: dict[str, str]) -> dict:
    code = "import json; from mimesis_lab.train.alloc import tune_process; print(json.dumps(tune_process()))"
    base = {k: v for k, v in os.environ.items() if k not in (*MALLOC_ENV, SWITCH_ENV)}
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**base, "PYTHONPATH": str(ROOT), **env})
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tune_process_applies_mallopt_where_the_environment_did_not():
    # glibc accepts each setting (mallopt returns 1); one already in the environment is glibc's own, not redone
    assert _tune_in_subprocess({}) == {k: int(v) for k, v in MALLOC_ENV.items()}
    assert _tune_in_subprocess({"MALLOC_TOP_PAD_": "0"}) == {"MALLOC_MMAP_THRESHOLD_": 33554432,
                                                             "MALLOC_TRIM_THRESHOLD_": 1073741824}
    assert _tune_in_subprocess({SWITCH_ENV: "0"}) == {}
