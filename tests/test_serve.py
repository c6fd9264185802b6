"""Prefect deployments (flows/serve.py): typed overrides merged and validated, one deployment per
phase plus the pipeline, training phases limited to one at a time."""
from __future__ import annotations

import pytest

from flows import serve
from mimesis_lab.config import ConfigError, parse_params


def test_typed_overrides_land_in_the_phase_section():
    d = serve.merged_params("agent_csd", steps=7, seed=5, alpha=0.02,
                            overrides={"agent_csd.rollout.max_turns": 2})
    p = parse_params(d)
    assert p.agent_csd.steps == 7 and p.agent_csd.seed == 5 and p.agent_csd.csd.alpha == 0.02
    assert p.agent_csd.rollout.max_turns == 2
    # sibling-checked fields follow to agent_grpo (the two stay comparable); alpha does not
    assert p.agent_grpo.steps == 7 and p.agent_grpo.seed == 5 and p.agent_grpo.rollout.max_turns == 2


def test_seed_of_grpo_keeps_the_csd_sibling():
    p = parse_params(serve.merged_params("agent_grpo", seed=99))
    assert p.agent_grpo.seed == p.agent_csd.seed == 99      # the sibling check still passes


def test_bad_overrides_are_clear_errors():
    with pytest.raises(ValueError, match="alpha is the CSD weight"):
        serve.merged_params("agent_grpo", alpha=0.1)
    with pytest.raises(ConfigError, match="agent_grpo.stepz"):
        serve.merged_params("agent_grpo", overrides={"agent_grpo.stepz": 3})
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
    assert set(deps) == {"mimesis-pipeline", *serve.PHASES}
    assert all(d.concurrency_limit == 1 for d in deps.values())
    assert deps["agent_csd"].parameters == {"phase": "agent_csd"} and "training" in deps["agent_csd"].tags
    assert "evaluation" in deps["report"].tags
    props = deps["agent_csd"]._parameter_openapi_schema.properties
    assert {"phase", "profile", "steps", "seed", "alpha", "overrides"} <= set(props)
