"""The report (paper Table 2 shape), its plots/CSVs, and the eval flows' metric flattening."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import yaml

from flows.eval import flat_agent, flat_sim
from mimesis_lab.evals import report as rep
from tests.conftest import ROOT


def _cell(score, invalid=0, rollouts=2, **kw):
    status = "invalid" if score is None else "ok"
    return {"score": score, "status": status, "rollouts": rollouts, "valid": rollouts - invalid, "invalid": invalid,
            "invalid_reasons": {"refusal": invalid} if invalid else {}, "pass_at_k": score, **kw}


AGENT = {
    "cells": {
        "base": {"u1": {"travel": _cell(0.1, micro_avg=0.2, micro_max=0.5), "persuade": _cell(None, 2)},
                 "u2": {"travel": _cell(0.3, micro_avg=0.3, micro_max=0.3), "persuade": _cell(0.0)}},
        "csd": {"u1": {"travel": _cell(0.4, micro_avg=0.5, micro_max=1.0), "persuade": _cell(0.2)},
                "u2": {"travel": _cell(0.3, micro_avg=0.3, micro_max=0.3), "persuade": _cell(0.5, 1)}},
    },
    "per_user": {"u1": {"mean": {"base": 0.1, "csd": 0.4}, "mean_rank": {"base": 2.0, "csd": 1.0}},
                 "u2": {"mean": {"base": 0.15, "csd": 0.4}, "mean_rank": {"base": 1.75, "csd": 1.25}}},
    "overall": {"mean": {"base": 0.125, "csd": 0.4}, "mean_rank": {"base": 1.83, "csd": 1.17}},
    "counts": {"rollouts": 16, "from_cache": 4, "run": 12, "invalid": 3, "invalid_cells": 1},
}

SIM = {
    "simulators": {
        "mimesis": {"fi": 80.0, "fi_ci": [70.0, 90.0], "fi_per_dim": {d: 80.0 for d in rep.FI_DIMS},
                    "d1": 90.0, "d2": 80.0, "d3": 70.0, "d4": 60.0, "ece": 0.1, "usi5": 78.0,
                    "turing_accuracy": 60.0, "turing_distance": 10.0,
                    "behavior": {"reward": 0.5, "reward_se": 0.05}, "soul": {"mean": 0.4, "se": 0.02, "per_task": {"a": 0.4}},
                    "counts": {"conversations": 4, "judge_failures": 1, "parse_failures": 0, "invalid": {"refusal": 2}}},
        "base": {"fi": 20.0, "fi_ci": None, "fi_per_dim": {d: 20.0 for d in rep.FI_DIMS}, "d1": None, "ece": None,
                 "usi5": None, "turing_distance": 50.0, "behavior": {}, "soul": {},
                 "counts": {"judge_failures": 0}},
    },
    "judge": "rule", "assistant": "replay", "discriminator": "rule", "note": "not comparable across judges",
}


def test_table2_bold_best_and_mr_lower_is_better():
    md = rep.table2_markdown(AGENT)
    lines = md.splitlines()
    assert lines[0].startswith("| Method | u1 Mean | u1 MR | u2 Mean | u2 MR | **Overall Mean** | **Overall MR** |")
    csd = next(line for line in lines if line.startswith("| csd |"))
    base = next(line for line in lines if line.startswith("| base |"))
    assert "**0.40**" in csd and "**1.00**" in csd and "**1.17**" in csd      # best mean and best (lowest) MR
    assert "**" not in base


def test_invalid_cells_shown_as_invalid_not_zero():
    md = rep.per_gym_markdown(AGENT)
    assert "invalid (2/2)" in md
    assert "0.50 (1 inv.)" in md
    assert "travel micro_max" in md
    rows = rep.per_gym_rows(AGENT)
    inv = [r for r in rows if r["status"] == "invalid"]
    assert len(inv) == 1 and inv[0]["score"] is None


def test_sim_table_and_missing_values():
    md = rep.sim_markdown(SIM)
    assert "80.00 [70.0, 90.0]" in md
    base = next(line for line in md.splitlines() if line.startswith("| base |"))
    assert "–" in base and "nan" not in base.lower()
    assert "refusal: 2" in md


def test_flatten_sim_and_agent_are_finite_and_named():
    f = flat_sim(SIM["simulators"]["mimesis"])
    assert f["fi"] == 80.0 and f["fi_ci_lo"] == 70.0 and f["fi/pacing"] == 80.0
    assert f["behavior/reward"] == 0.5 and f["soul/se"] == 0.02 and f["counts/invalid/refusal"] == 2
    fb = flat_sim(SIM["simulators"]["base"])
    assert "d1" not in fb and "usi5" not in fb and all(math.isfinite(v) for v in fb.values())
    a = flat_agent(AGENT, "base")
    assert a["score/u1/travel"] == 0.1 and "score/u1/persuade" not in a and a["invalid/u1/persuade"] == 2
    assert a["micro_max/u1/travel"] == 0.5 and a["mean/u2"] == 0.15 and a["mr/overall"] == 1.83


def test_headline_and_curves(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in [
        {"kind": "start"}, {"kind": "train", "step": 1, "metrics": {"reward/mean": 0.1}},
        {"kind": "train", "step": 2, "metrics": {"reward/mean": float("nan")}},
        {"kind": "train", "step": 3, "metrics": {"reward/mean": 0.3}}]) + "\n")
    curves = rep.training_curves({"agent_grpo": log, "agent_csd": tmp_path / "missing.jsonl"})
    assert curves == {"agent_grpo": [(1, 0.1), (3, 0.3)]}
    h = rep.headline(SIM, AGENT)
    assert h["sim.mimesis.fi"] == 80.0 and "sim.base.usi5" not in h and h["agent.csd.mean"] == 0.4
    assert h["agent.invalid_cells"] == 1.0


def test_plots_and_csvs_written(tmp_path):
    curves = {"agent_grpo": [(1, 0.1), (2, 0.2)], "agent_csd": [(1, 0.1), (2, 0.3)]}
    paths = rep.write_plots(tmp_path, SIM, AGENT, curves)
    assert [p.name for p in paths] == ["reward_curves.png", "per_gym.png", "fi_dims.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
    f = rep.write_csv(tmp_path / "per_gym.csv", rep.per_gym_rows(AGENT), ["method", "user", "gym", "score", "status"])
    assert f.read_text().splitlines()[0] == "method,user,gym,score,status"


EFFECTS = {
    "midtrain_loss_ratio": {"value": 0.6, "ci": None, "target": "<= 0.7 and final < unigram", "passed": True,
                            "missing_reason": None, "n": 7, "phase": "midtrain", "ci_note": "no per-example losses"},
    "sim_eval_vs_sft": {"value": 0.15, "ci": [0.1, 0.2], "target": "> 0", "passed": False, "n": 2, "phase": "sim_eval",
                        "identical_to": "sft", "ci_unit": "task",
                        "missing_reason": "the simulator 'mimesis' has the same final weights as sft (sha256)"},
    "csd_coach_note_rate": {"value": 0.1, "ci": [0.05, 0.2], "target": ">= 0.3", "passed": False, "n": 40,
                            "phase": "agent_csd", "missing_reason": None, "ci_unit": "step"},
    "rank_spread": {"value": None, "ci": None, "target": "> 0", "passed": False, "n": 0, "phase": "agent_eval",
                    "missing_reason": "eval/agent_eval/summary.json has fewer than 2 methods with an overall MR"},
}


def test_does_it_work_section_rows_and_flags():
    md = rep.effects_markdown(EFFECTS, {"sim_rl": "sft"})
    lines = md.splitlines()
    assert lines[0] == "## Does it work?" and "synthetic" in md and "not the paper's effect sizes" in md
    assert "the final weights of `sim_rl` equal those of `sft`" in md
    assert "1 of 4 targets met, 1 missing" in md
    row = {ln.split("`")[1]: ln for ln in lines if ln.startswith("| ") and "`" in ln}
    assert row["midtrain_loss_ratio"].endswith("| <= 0.7 and final < unigram | 7 | PASS |")
    assert "| 0.150 | [0.100, 0.200] |" in row["sim_eval_vs_sft"]
    assert "FAIL** (identical weights)" in row["sim_eval_vs_sft"]
    assert row["csd_coach_note_rate"].endswith("| >= 0.3 | 40 | **FAIL** |")
    assert row["rank_spread"].endswith("| – | – | > 0 | 0 | **MISSING** |")
    assert "- `rank_spread`: eval/agent_eval/summary.json has fewer than 2 methods" in md
    assert "- `csd_coach_note_rate`: CI unit: step." in md


def test_report_opens_with_does_it_work():
    md = rep.report_markdown(SIM, AGENT, {}, {"report": "http://x"}, effects=EFFECTS, identical={})
    heads = [ln for ln in md.splitlines() if ln.startswith("## ")]
    assert heads[0] == "## Does it work?" and heads[1].startswith("## Agents across evaluation users")
    assert "Identical checkpoints" not in md
    assert "Does it work?" not in rep.report_markdown(SIM, AGENT, {})      # no effects given: no section


def test_report_says_how_many_tasks_each_user_played():
    same = {"settings": {"tasks_by_user": {"u1": {"travel": 4, "tau": 4}, "u2": {"travel": 4, "tau": 4}}}}
    assert rep.tasks_by_user_line(same) is None and rep.tasks_by_user_line({}) is None
    uneven = {"settings": {"tasks_by_user": {"scripted": {"travel": 30, "search": 30, "tau": 29},
                                             "sim": {"travel": 4, "search": 4, "tau": 4}}}}
    line = rep.tasks_by_user_line(uneven)
    assert line.endswith("`scripted` 29–30, `sim` 4.")
    md = rep.report_markdown(SIM, {**AGENT, **uneven}, {})
    assert line in md and md.index(line) < md.index("Rollouts:")


def test_report_effects_from_params_have_the_exact_shape(tmp_path, monkeypatch):
    """flows.eval._effects on a project whose outputs are absent except two identical simulator checkpoints: every
    effect present with {value, ci, target, passed}, the missing ones with a reason, the identical pair flagged."""
    from flows.eval import _effects, flat_effects
    from mimesis_lab.config import load_params
    from mimesis_lab.evals.effects import PHASE_OF

    monkeypatch.chdir(tmp_path)
    for d in ("models/sft/final", "models/sim_rl/final"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "model.safetensors").write_bytes(b"w")
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "midtrain.json").write_text(json.dumps({"initial_val_loss": 8.0, "final_val_loss": 7.2,
                                                                    "unigram_val_loss": 7.0}))
    effects, identical, sha = _effects(load_params(str(ROOT / "params.yaml")))
    assert list(effects) == list(PHASE_OF) and identical == {"sim_rl": "sft"} and sha["agent_csd"] is None
    for e in effects.values():
        assert {"value", "ci", "target", "passed"} <= set(e) and isinstance(e["passed"], bool)
        assert e["value"] is not None or e["missing_reason"]
    ratio, uni = effects["midtrain_loss_ratio"], effects["midtrain_vs_unigram"]
    assert ratio["value"] == pytest.approx(0.9) and not ratio["passed"]           # 7.2 / 8 > 0.7
    assert uni["value"] == pytest.approx(0.2) and uni["ci"] is None and not uni["passed"]   # 7.2 - 7.0
    assert effects["sim_rl_reward_gain"]["identical_to"] == "sft"
    flat = flat_effects(effects)
    assert flat["effects/midtrain_loss_ratio"] == pytest.approx(0.9)
    assert flat["effects/midtrain_loss_ratio/passed"] == 0.0
    assert "effects/rank_spread" not in flat and flat["effects/rank_spread/passed"] == 0.0


@pytest.mark.slow
def test_report_flow_runs_under_prefect(tmp_path):
    """The real `report` Prefect flow on saved summaries (tracking off): markdown, plots, metrics."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["tracking"]["enabled"] = False
    params["sim_eval"]["output_dir"] = str(tmp_path / "sim")
    params["agent_eval"]["output_dir"] = str(tmp_path / "agent")
    for sec in ("agent_grpo", "agent_csd"):
        params[sec]["output_dir"] = str(tmp_path / sec)
        (tmp_path / sec).mkdir()
        (tmp_path / sec / "metrics.jsonl").write_text(
            json.dumps({"kind": "train", "step": 1, "metrics": {"reward/mean": 0.2}}) + "\n")
    params["report"] = {"output": str(tmp_path / "r" / "report.md"), "plots_dir": str(tmp_path / "r" / "plots"),
                        "metrics": str(tmp_path / "r" / "report.json")}
    (tmp_path / "sim").mkdir()
    (tmp_path / "agent").mkdir()
    (tmp_path / "sim" / "summary.json").write_text(json.dumps(SIM))
    (tmp_path / "agent" / "summary.json").write_text(json.dumps(AGENT))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "flows.eval", "--phases", "report", "--params",
                          str(tmp_path / "params.yaml")], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Table 2 shape" in md and "invalid (2/2)" in md and "![per_gym](plots/per_gym.png)" in md
    assert md.split("\n## ")[1].startswith("Does it work?") and "**MISSING**" in md
    head = json.loads((tmp_path / "r" / "report.json").read_text())
    assert head["agent.csd.mean_rank"] == 1.17
    assert head["effects"]["rank_spread"]["value"] == pytest.approx(1.83 - 1.17)
    assert all({"value", "ci", "target", "passed"} <= set(e) for e in head["effects"].values())
    assert (tmp_path / "r" / "plots" / "reward_curves.csv").read_text().count("\n") == 3
