"""Prefect deployments (flows/serve.py): typed overrides merged and validated, one deployment per
phase plus the pipeline, training phases limited to one at a time."""
from __future__ import annotations

import pytest
import yaml

from flows import serve
from mimesis_lab.config import ConfigError, parse_params
from tests.conftest import ROOT


def test_shared_settings_land_in_the_shared_group():
    d = serve.merged_params("agent_csd", steps=7, seed=5, alpha=0.02,
                            overrides={"agent_csd.rollout.max_turns": 2})
    # steps, seed and rollout are agent_rl settings: written once there, so both runs get them
    assert d["agent_rl"]["steps"] == 7 and d["agent_rl"]["seed"] == 5
    assert d["agent_rl"]["rollout"]["max_turns"] == 2
    assert set(d["agent_csd"]) == {"output_dir", "csd"}        # nothing copied into the phase section
    p = parse_params(d)
    assert (p.agent_csd.steps, p.agent_csd.seed, p.agent_csd.rollout.max_turns) == (7, 5, 2)
    assert (p.agent_grpo.steps, p.agent_grpo.seed, p.agent_grpo.rollout.max_turns) == (7, 5, 2)
    # alpha is the CSD term's own: agent_csd.csd.alpha, not shared
    assert p.agent_csd.csd.alpha == 0.02 and "csd" not in d["agent_rl"]


def test_a_key_the_phase_writes_itself_is_overridden_there(tmp_path):
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["agent_csd"]["lr"] = 5.0e-5                 # a deliberate ablation: CSD with its own lr
    base = tmp_path / "params.yaml"
    base.write_text(yaml.safe_dump(data, sort_keys=False))
    d = serve.merged_params("agent_csd", overrides={"agent_csd.lr": 2.0e-5, "midtrain.seed": 9}, base=base)
    assert d["agent_csd"]["lr"] == 2.0e-5 and d["agent_rl"]["lr"] == 1.0e-4
    assert d["sft_run"]["seed"] == 9 and "seed" not in d["midtrain"]


def test_bad_overrides_are_clear_errors():
    with pytest.raises(ValueError, match="alpha is the CSD weight"):
        serve.merged_params("agent_grpo", alpha=0.1)
    with pytest.raises(ConfigError, match="agent_grpo.stepz"):
        serve.merged_params("agent_grpo", overrides={"agent_grpo.stepz": 3})
    with pytest.raises(ConfigError, match="agent_rl.lr"):
        serve.merged_params("agent_grpo", overrides={"agent_grpo.lr": -1.0})
    with pytest.raises(ConfigError, match="steps"):
        serve.merged_params("midtrain", overrides={"midtrain.steps": "many"})
    with pytest.raises(ValueError, match="unknown phase"):
        serve.merged_params("nope")
    with pytest.raises(ValueError, match="unknown profile"):
        serve.merged_params("sft", profile="huge")


def test_paper_profile_merges():
    p = parse_params(serve.merged_params("sim_eval", profile="paper"))
    assert p.model.init == "pretrained" and p.sim_eval.judge.kind == "openai"


def test_one_deployment_per_phase_and_the_pipeline():
    deps = {d.name: d for d in serve.deployments()}
    assert set(deps) == {"mimesis-pipeline", "mimesis-seeds", *serve.PHASES}
    assert all(d.concurrency_limit == 1 for d in deps.values())
    assert deps["agent_csd"].parameters == {"phase": "agent_csd"} and "training" in deps["agent_csd"].tags
    assert "evaluation" in deps["report"].tags
    props = deps["agent_csd"]._parameter_openapi_schema.properties
    assert {"phase", "profile", "steps", "seed", "alpha", "overrides"} <= set(props)
