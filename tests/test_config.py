from typing import get_args

import pytest
import yaml
from pydantic import BaseModel

from mimesis_lab import config as C
from tests.conftest import ROOT


def _params():
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_bundled_params_validate():
    p = C.load_params(ROOT / "params.yaml")
    assert p.role_swap.no_swap_sources == ["tom_social"]
    assert abs(sum(p.splits.fractions.values()) - 1) < 1e-9
    assert p.validate_.fail_on_error is True


def test_bundled_behaviour_tasks_fit_the_episodes_that_use_them():
    """The behaviour kwargs are timed for ``behavior_tasks.turn_budget``; an episode with fewer turns could not
    reach a behaviour timed for a later turn (sim_rl warns, :func:`mimesis_lab.envs.behavior_task.unreachable_rows`)."""
    p = C.load_params(ROOT / "params.yaml")
    episodes = [p.sim_eval.turn_budget, p.sim_rl.tasks["usersim_behavior"].turn_budget]
    assert all(b is None or b >= p.behavior_tasks.turn_budget for b in episodes)


def test_unknown_key_is_named():
    d = _params()
    d["role_swap"]["sead"] = 1
    with pytest.raises(C.ConfigError, match=r"unknown key `role_swap.sead`"):
        C.parse_params(d, "params.yaml")


def test_unknown_section_is_named():
    d = _params()
    d["rolle_swap"] = {}
    with pytest.raises(C.ConfigError, match=r"unknown key `rolle_swap`"):
        C.parse_params(d)


@pytest.mark.parametrize("section,key,value", [
    ("role_swap", "seed", "1234"),
    ("thoughttrace", "include_reactions", "yes"),
    ("splits", "seed", 1.5),
    ("behavior_tasks", "turn_budget", "8"),
])
def test_wrong_type_is_named(section, key, value):
    d = _params()
    d[section][key] = value
    with pytest.raises(C.ConfigError, match=rf"params.yaml: `{section}.{key}`"):
        C.parse_params(d, "params.yaml")


def test_fractions_must_sum_to_one():
    d = _params()
    d["splits"]["fractions"] = {"train": 0.8, "val": 0.3}
    with pytest.raises(C.ConfigError, match="splits.fractions"):
        C.parse_params(d)


def test_ratio_must_be_positive():
    d = _params()
    d["role_swap"]["mixture"] = {"data/raw/chats/*.jsonl": 0.0}
    with pytest.raises(C.ConfigError, match="role_swap.mixture"):
        C.parse_params(d)


def test_unreadable_and_invalid_yaml(tmp_path):
    with pytest.raises(C.ConfigError, match="cannot read"):
        C.load_params(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("role_swap: [unclosed\n")
    with pytest.raises(C.ConfigError, match="invalid YAML"):
        C.load_params(bad)


def _types(annotation):
    """``annotation`` and every type inside it (``TrainParams | None``, ``dict[str, SimTaskParams]``)."""
    yield annotation
    for arg in get_args(annotation):
        yield from _types(arg)


def _models(model: type[BaseModel], seen=None):
    seen = seen if seen is not None else set()
    if model in seen:
        return seen
    seen.add(model)
    for f in model.model_fields.values():
        for ann in _types(f.annotation):
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                _models(ann, seen)
    return seen


def test_every_field_has_help_text():
    assert {C.TrainParams, C.SimTaskParams, C.EvalUserParams} <= _models(C.Params)   # inside `| None`, dicts
    for model in _models(C.Params):
        for name, f in model.model_fields.items():
            assert f.description, f"{model.__name__}.{name} has no help text"


def test_flatten():
    assert C.flatten({"a": {"b": 1, "c": {"d": "x"}}}) == {"a.b": 1, "a.c.d": "x"}


def test_profile_merge_cli(tmp_path):
    out = tmp_path / "merged.yaml"
    assert C.main(["--params", str(ROOT / "params.yaml"), "--profile",
                   str(ROOT / "configs/paper/params.paper.yaml"), "-o", str(out)]) == 0
    merged = C.load_params(out)
    assert merged.model.init == "pretrained" and merged.midtrain.deepspeed_config.startswith("configs/paper/")
    assert C.merge_profile({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}) == {"a": {"b": 1, "c": 3}}
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {hidden_sise: 3}\n")
    assert C.main(["--params", str(ROOT / "params.yaml"), "--profile", str(bad)]) == 2


# --- shared groups: sft_run (midtrain, sft, agent_sft) and agent_rl (agent_grpo, agent_csd) ---

def test_a_shared_group_is_written_once_and_read_by_each_phase():
    d = _params()
    assert set(d["agent_grpo"]) == {"output_dir"} and set(d["agent_csd"]) == {"output_dir", "csd"}
    p = C.parse_params(d)
    # agent_rl.lr: 1.0e-4 reaches both runs; each keeps its own output_dir
    assert p.agent_grpo.lr == p.agent_csd.lr == d["agent_rl"]["lr"] == 1.0e-4
    assert (p.agent_grpo.output_dir, p.agent_csd.output_dir) == ("models/agent_grpo", "models/agent_csd")
    # sft_run.deepspeed_config reaches midtrain, sft and agent_sft; lr is each phase's own
    assert p.midtrain.deepspeed_config == p.sft.deepspeed_config == p.agent_sft.deepspeed_config
    assert (p.midtrain.lr, p.sft.lr, p.agent_sft.lr) == (0.005, 0.006, 0.005)


def test_a_phase_section_overrides_its_group():
    d = _params()
    d["agent_csd"]["lr"] = 5.0e-5                       # a deliberate ablation: CSD with its own lr
    d["agent_csd"]["rollout"] = {"max_turns": 2}        # a sub-section merges key by key
    d["agent_csd"]["gyms"] = {"travel": 1.0}            # a mapping of free names is replaced whole
    p = C.parse_params(d)
    assert (p.agent_csd.lr, p.agent_grpo.lr) == (5.0e-5, 1.0e-4)
    assert (p.agent_csd.rollout.max_turns, p.agent_grpo.rollout.max_turns) == (2, 5)
    assert p.agent_csd.rollout.temperature == d["agent_rl"]["rollout"]["temperature"]
    assert p.agent_csd.gyms == {"travel": 1.0} and len(p.agent_grpo.gyms) == 5


def test_full_sections_without_groups_still_load():
    full = C.resolve_groups(_params())
    assert "agent_rl" not in full and "sft_run" not in full
    assert full["agent_csd"]["lr"] == full["agent_grpo"]["lr"] == 1.0e-4
    assert C.parse_params(full) == C.parse_params(_params())


@pytest.mark.parametrize("section,key,written", [
    ("agent_rl", "lr", "agent_rl.lr"),                  # named once, where it is written
    ("agent_csd", "lr", "agent_csd.lr"),
    ("sft_run", "max_len", "sft_run.max_len"),
])
def test_a_bad_value_is_named_where_it_is_written(section, key, written):
    d = _params()
    d[section][key] = -1
    with pytest.raises(C.ConfigError) as e:
        C.parse_params(d, "params.yaml")
    assert str(e.value).count(f"`{written}`") == 1, str(e.value)


def test_group_key_errors():
    d = _params()
    d["agent_rl"]["sead"] = 1
    with pytest.raises(C.ConfigError, match=r"unknown key `agent_rl.sead`$"):
        C.parse_params(d)
    d = _params()
    d["agent_rl"]["csd"] = {"alpha": 0.1}              # valid for agent_csd only
    with pytest.raises(C.ConfigError, match=r"unknown key `agent_rl.csd` \(not a key of agent_grpo"):
        C.parse_params(d)
    d = _params()
    d["agent_rl"]["output_dir"] = "models/agent"        # both runs would write one folder
    with pytest.raises(C.ConfigError, match=r"`agent_rl.output_dir`: write output_dir in each phase section"):
        C.parse_params(d)


def test_override_target_keeps_siblings_sharing():
    d = _params()
    d["agent_csd"]["lr"] = 5.0e-5
    assert C.override_target(d, "agent_grpo.rollout.max_turns") == "agent_rl.rollout.max_turns"
    assert C.override_target(d, "agent_csd.lr") == "agent_csd.lr"              # the phase writes it itself
    assert C.override_target(d, "agent_csd.csd.alpha") == "agent_csd.csd.alpha"  # not a shared setting
    assert C.override_target(d, "agent_grpo.output_dir") == "agent_grpo.output_dir"
    assert C.override_target(d, "midtrain.seed") == "sft_run.seed"
    assert C.override_target(d, "sim_rl.lr") == "sim_rl.lr"                    # no group


# --- help where people read it: --explain KEY and the generated `#:` comments of params.yaml ---

def test_every_key_of_params_yaml_carries_its_generated_comment():
    text = (ROOT / "params.yaml").read_text()
    assert C.annotate(text) == text, "stale comments: run `python -m mimesis_lab.config --annotate params.yaml`"
    lines = text.splitlines()
    keyed = C.config_help.key_lines(text, C.SCHEMA)
    for n, doc in keyed:
        if not doc.below_free:                      # a glob of role_swap.mixture: its parent has the comment
            assert lines[n - 1].lstrip().startswith("#: "), f"line {n + 1}: `{doc.key}` has no comment"
    at = {doc.key: n for n, doc in keyed}
    # the comment is the field's description and its default (AgentGRPOParams.lr: 1e-5)
    assert lines[at["agent_rl.lr"] - 1] == "  #: Peak learning rate (AdamW). (default: 1.0e-05)"
    assert lines[at["agent_rl.user.openai.model"] - 1].endswith("(default: simulator)")  # the parent's default
    assert not lines[at["role_swap.mixture.data/world/chats/tom_social.jsonl"] - 1].lstrip().startswith("#:")


def test_annotate_keeps_values_and_hand_written_comments():
    text = ("# my notes\n"
            "agent_csd:\n"
            "  #: an old description\n"
            "  output_dir: models/agent_csd   # kept\n"
            "  csd:\n"
            "    alpha: 0.3\n")
    assert C.annotate(text) == ("# my notes\n"
                                "#: Agent GRPO + coached self-distillation (CSD).\n"
                                "agent_csd:\n"
                                "  #: Checkpoints, rollouts.jsonl, metrics.jsonl, final/. (default: models/agent_csd)\n"
                                "  output_dir: models/agent_csd   # kept\n"
                                "  #: The CSD term.\n"
                                "  csd:\n"
                                "    #: Weight of the CSD loss (0 = plain GRPO, the baseline). (default: 0.01)\n"
                                "    alpha: 0.3\n")
    with pytest.raises(ValueError, match="section `sim_eval.judge.openai` is written in flow style"):
        C.annotate("sim_eval:\n  judge:\n    openai: {model: judge}\n")


def test_explain_a_key():
    text = C.explain("agent_csd.lr")
    assert "type:    float (> 0)" in text and "default: 1.0e-05" in text and "Peak learning rate (AdamW)." in text
    assert "written once as agent_rl.lr for agent_grpo, agent_csd" in text
    assert "default: judge" in C.explain("sim_rl.judge.openai.model")       # JudgeParams' endpoint default
    assert "keys: train, val, init_from" in C.explain("sft_run")
    with pytest.raises(KeyError, match="`agent_rl.output_dir`: output_dir is written in each phase section"):
        C.explain("agent_rl.output_dir")
    with pytest.raises(KeyError, match="unknown key `agent_rl.lrr`"):
        C.explain("agent_rl.lrr")


def test_explain_and_annotate_cli(tmp_path, capsys):
    assert C.main(["--explain", "agent_csd.csd.alpha"]) == 0
    assert "Weight of the CSD loss" in capsys.readouterr().out
    assert C.main(["--explain", "agent_csd.csd.alfa"]) == 2
    stale = tmp_path / "params.yaml"
    stale.write_text((ROOT / "params.yaml").read_text().replace("#: Peak learning rate", "#: old text"))
    assert C.main(["--annotate", str(stale)]) == 0
    assert stale.read_text() == (ROOT / "params.yaml").read_text()


def test_yaml_load_reads_params_and_lock_as_safe_load_does():
    """The C loader (used for speed in every stage's start and MLflow provenance) gives safe_load's result."""
    for name in ("params.yaml", "dvc.lock", "dvc.yaml"):
        text = (ROOT / name).read_text(encoding="utf-8")
        assert C.yaml_load(text) == yaml.safe_load(text), name
    with pytest.raises(yaml.YAMLError):
        C.yaml_load("a: [1, 2")
    with pytest.raises(yaml.YAMLError):        # safe: no arbitrary Python objects
        C.yaml_load("!!python/object/apply:os.system ['true']")
