"""Progress: rate/ETA lines naming the phase and MLflow run; a bar only on a terminal."""
from __future__ import annotations

import io

from mimesis_lab.progress import Progress, format_eta, progress_mode


class _TTY(io.StringIO):
    def isatty(self):
        return True


def test_mode_follows_the_terminal_and_the_override(monkeypatch):
    monkeypatch.delenv("MIMESIS_PROGRESS", raising=False)
    assert progress_mode(io.StringIO()) == "lines"
    assert progress_mode(_TTY()) == "bar"
    monkeypatch.setenv("MIMESIS_PROGRESS", "off")
    assert progress_mode(_TTY()) == "off"


def test_lines_name_phase_and_run_with_rate_and_eta(monkeypatch):
    monkeypatch.setenv("MLFLOW_RUN_ID", "3f2a9c1b00aa")
    out = io.StringIO()
    p = Progress(4, "agent_grpo", unit="step", stream=out, mode="lines", every_s=3600)
    p._t0 -= 2.0                              # two seconds have passed
    p.update(1, reward=0.125)                 # the first line always prints
    p.update(1)                               # throttled
    p.update(2)                               # the last one always prints
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("[agent_grpo run=3f2a9c1b] 1/4 (25%)") and "step/s" in lines[0]
    assert "ETA" in lines[0] and lines[0].endswith("reward=0.125")
    assert lines[1].startswith("[agent_grpo run=3f2a9c1b] 4/4 (100%)") and "ETA 0:00:00" in lines[1]


def test_eta_from_rate_and_resumed_start(monkeypatch):
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    p = Progress(10, "midtrain", initial=4, mode="off")
    p._t0 -= 2.0
    p.update(2)                               # 2 steps in 2 s since the resume -> 1/s, 4 left
    assert abs(p.rate - 1.0) < 0.05 and abs(p.eta_s - 4.0) < 0.3
    assert p.line().startswith("[midtrain] 6/10 (60%)")
    assert format_eta(3725) == "1:02:05" and format_eta(None) == "?"


def test_bar_on_a_terminal():
    out = _TTY()
    with Progress(3, "agent_eval", unit="rollout", stream=out) as p:
        p.update(3)
    assert "agent_eval" in out.getvalue() and "3/3" in out.getvalue()
