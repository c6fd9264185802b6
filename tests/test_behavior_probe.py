"""scripts/behavior_probe.py on a tiny random simulator and the B9 rows of scripts/sim_rl_signal.py."""
from __future__ import annotations

import json

import pytest

from tests.conftest import load_script



@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probe")
    params = load_script("sim_rl_signal").build(tmp, steps=1)
    return tmp, params


def test_probe_counts_and_pairs(tiny, capsys):
    tmp, params = tiny
    probe = load_script("behavior_probe")
    out = probe.probe(str(tmp / "init"), str(params), k=2)
    # 8 instructed B9 rows x 2 rollouts, the sim_rl sampling settings of the params file
    assert out["rows"] == 8 and out["rollouts"] == 16 and out["k"] == 2
    assert out["temperature"] == 0.8 and out["top_p"] == 0.7
    assert 0.0 <= out["exhibit_mean"] <= 1.0 and 0.0 <= out["format_failure_rollouts"] <= 1.0
    assert set(out["exhibit_by_behavior"]) <= {"B9"} and len(out["exhibit_by_row"]) <= 8
    assert out["judged"] + sum(out["invalid"].values()) <= 16
    # the same checkpoint against itself: same rows, same seeds -> identical rollouts, a paired difference of 0
    dest = tmp / "probe.json"
    assert probe.main([str(tmp / "init"), "--params", str(params), "--k", "2", "--compare", str(tmp / "init"),
                       "--json", str(dest)]) == 0
    got = json.loads(dest.read_text())
    assert got["exhibit_by_row"] == out["exhibit_by_row"]
    cmp = got["compare"]
    assert cmp["rows"] == len(out["exhibit_by_row"]) and cmp["exhibit_diff"] == 0.0
    assert cmp["ci"] is None or cmp["ci"] == [0.0, 0.0]
    assert cmp["other_exhibit_mean"] == out["exhibit_mean"]
