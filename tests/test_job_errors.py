"""Deterministic failures stop at once with a message naming the key; only what a retry can fix is retried."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from flows.train import retryable
from mimesis_lab.train.launch import LaunchError

ROOT = Path(__file__).resolve().parents[1]


class FailedState:
    """The part of a Prefect state that ``retry_condition_fn`` reads."""

    def __init__(self, exc: BaseException):
        self.exc = exc

    def result(self, raise_on_failure: bool = True):
        return self.exc


def test_clear_job_errors_are_not_retried_crashes_are():
    bad_params = LaunchError(2, ["deepspeed", "…"], "error: [sft rank 0] TrainConfigError: sft.init_from: …")
    killed = LaunchError(-9, ["deepspeed", "…"], "Killed")
    assert retryable(None, None, FailedState(bad_params)) is False
    assert retryable(None, None, FailedState(killed)) is True
    assert retryable(None, None, FailedState(RuntimeError("transient"))) is True


def test_missing_init_from_names_the_key_and_the_cause(tmp_path):
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["sft"]["init_from"] = str(tmp_path / "no_such_model")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    res = subprocess.run([sys.executable, "-m", "mimesis_lab.jobs.sft", "--phase", "sft", "--params",
                          str(tmp_path / "params.yaml")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "sft.init_from" in res.stderr and "does not exist" in res.stderr and "okenizer" not in res.stderr


def test_a_privacy_leak_stops_the_job_with_status_2_so_it_is_not_retried(capsys):
    """Agent rollouts are seeded: a job resumed after a PrivacyError meets the same leak at the same step, so the
    job exits with the clear-error status and the flow does not retry it (it did twice, 1.5 min each)."""
    from mimesis_lab.rollout.agent_env import PrivacyError
    from mimesis_lab.train.runtime import job_main

    def run(phase, params):
        raise PrivacyError("step 11: simulator reasoning found in 1 agent input(s); first: s10g0r1: 'x'")

    rc = job_main(run, ("agent_grpo",), prog="test", description="test",
                  argv=["--phase", "agent_grpo", "--params", str(ROOT / "params.yaml")])
    assert rc == 2
    assert "PrivacyError: step 11" in capsys.readouterr().err
    assert retryable(None, None, FailedState(LaunchError(rc, ["python"], "error: …"))) is False
