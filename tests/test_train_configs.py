"""Every training config file parses and validates: DeepSpeed JSONs through DeepSpeed's own
parser, the paper profile through ``parse_params`` after merging it onto ``params.yaml``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mimesis_lab.config import load_params, parse_params, resolve_groups
from mimesis_lab.train.runtime import TrainConfigError, load_ds_config

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "configs" / "tiny" / "ds_zero2.json"
PAPER = ROOT / "configs" / "paper"
TINY_RL = ROOT / "configs" / "tiny" / "ds_rl.json"
DS_FILES = [TINY, TINY_RL, PAPER / "ds_midtrain.json", PAPER / "ds_sft.json", PAPER / "ds_sim_rl.json",
            PAPER / "ds_agent_rl.json"]
# top-level keys we allow ourselves (DeepSpeed silently ignores unknown top-level keys: a typo
# such as "gradient_cliping" would otherwise pass its parser)
KNOWN_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
              "gradient_clipping", "fp16", "bf16", "data_types", "zero_optimization",
              "zero_allow_untested_optimizer", "steps_per_print", "wall_clock_breakdown",
              "managed_gradient_accumulation"}


def merge(base: dict, over: dict) -> dict:
    """Deep merge: mappings merged key by key, anything else replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def _ds(path: Path):
    from deepspeed.runtime.config import DeepSpeedConfig

    return DeepSpeedConfig(str(path))          # world size 1 here (no process group)


@pytest.fixture(scope="module")
def paper_params():
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    over = yaml.safe_load((PAPER / "params.paper.yaml").read_text())
    return parse_params(merge(base, over), PAPER / "params.paper.yaml")


@pytest.mark.parametrize("path", DS_FILES, ids=lambda p: p.name)
def test_deepspeed_json_parses_with_deepspeed(path):
    raw = load_ds_config(path)                 # our rules: no optimizer / scheduler
    assert set(raw) <= KNOWN_KEYS, set(raw) - KNOWN_KEYS
    cfg = _ds(path)
    assert cfg.gradient_clipping == 1.0
    assert cfg.optimizer_name is None and cfg.scheduler_name is None
    assert cfg.train_batch_size == cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps


def test_tiny_config_is_cpu_fp32_zero2():
    cfg = _ds(TINY)
    assert cfg.zero_optimization_stage == 2
    assert not cfg.bfloat16_config.enabled and not cfg.float16_config.enabled
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu) == (2, 1)   # global batch fixed across world sizes
    params = load_params(ROOT / "params.yaml")
    for phase in (params.midtrain, params.sft):
        assert (ROOT / phase.deepspeed_config).resolve() == TINY.resolve()


def test_paper_configs_are_bf16_zero3_with_the_paper_batch(paper_params):
    mid, sft = _ds(PAPER / "ds_midtrain.json"), _ds(PAPER / "ds_sft.json")
    for cfg in (mid, sft):
        assert cfg.zero_optimization_stage == 3 and cfg.bfloat16_config.enabled
    assert mid.train_batch_size == 4096                       # sequences per step (SPEC §2.1)
    # the global batch splits evenly over the paper's world sizes
    for cfg, phase in ((mid, paper_params.midtrain), (sft, paper_params.sft)):
        per_step = cfg.train_micro_batch_size_per_gpu * phase.world_size
        assert cfg.train_batch_size % per_step == 0, (cfg.train_batch_size, per_step)
    assert mid.train_batch_size // (mid.train_micro_batch_size_per_gpu * paper_params.midtrain.world_size) == 128


def test_paper_profile_validates_with_the_paper_settings(paper_params):
    p = paper_params
    assert p.model.init == "pretrained" and p.model.pretrained_path
    assert p.tokenizer.pretrained == p.model.pretrained_path
    m, s = p.midtrain, p.sft
    assert (m.lr, m.max_steps, m.max_len, m.world_size) == (3e-5, 5000, 24576, 32)
    assert (s.lr, s.epochs, s.max_len, s.world_size) == (1e-7, 3.0, 32768, 8)
    assert s.init_from == "models/midtrain/final"
    assert m.deepspeed_config == "configs/paper/ds_midtrain.json" and s.deepspeed_config == "configs/paper/ds_sft.json"
    for phase in (m, s):
        assert (ROOT / phase.deepspeed_config).is_file()
    r = p.sim_rl                                   # SPEC §2.3: 500 steps, 64 x 8 rollouts, lr 8e-6, vLLM
    assert (r.steps, r.prompts_per_step, r.rollouts_per_prompt, r.lr, r.world_size) == (500, 64, 8, 8e-6, 16)
    assert r.rollout.backend == "vllm" and r.require_think and r.judge.kind == "openai"
    assert r.kl_coef == 0.0 and p.agent_grpo.kl_coef == 0.0 and p.agent_csd.kl_coef == 0.0   # the paper: no KL
    assert p.agent_traces.coached_share == 0.0   # the paper's warm start: no coach notes (tiny profile: 0.3)
    assert r.prompts_per_step % r.world_size == 0   # whole groups per rank
    rl = _ds(ROOT / r.deepspeed_config)
    assert rl.zero_optimization_stage == 3 and rl.bfloat16_config.enabled
    assert load_ds_config(ROOT / r.deepspeed_config)["managed_gradient_accumulation"] is False


def test_paper_profile_encodes_the_agent_settings_of_spec_3_2(paper_params):
    """SPEC §3.2: Qwen3-8B from an SFT checkpoint, 100 steps, 8 rollouts/prompt, <= 16 turns, lr 1e-6,
    gamma 0.8, T = 1.0 in training and 0 in evaluation, prompt 1,152 + response 8,192 tokens, vLLM,
    16 x A100; §3.3: CSD alpha 0.01, beta 5.0."""
    p = paper_params
    assert p.agent_sft.init_from == "checkpoints/Qwen3-8B"          # the actor (a placeholder local path)
    for rl in (p.agent_grpo, p.agent_csd):                          # both read agent_rl: siblings
        assert rl.init_from == f"{p.agent_sft.output_dir}/final"    # RL starts from the SFT checkpoint
        assert (rl.steps, rl.rollouts_per_prompt, rl.lr, rl.gamma, rl.world_size) == (100, 8, 1e-6, 0.8, 16)
        assert (rl.rollout.backend, rl.rollout.max_turns, rl.rollout.temperature) == ("vllm", 16, 1.0)
        assert rl.rollout.max_total_tokens == 1152 + 8192           # one budget for prompt + response
        assert rl.prompts_per_step % rl.world_size == 0             # whole groups per rank
        assert rl.deepspeed_config == "configs/paper/ds_agent_rl.json"
    assert p.agent_grpo.model_dump(exclude={"output_dir"}) == p.agent_csd.model_dump(exclude={"output_dir", "csd"})
    assert (p.agent_csd.csd.alpha, p.agent_csd.csd.beta) == (0.01, 5.0)
    assert (p.agent_eval.rollout.temperature, p.agent_eval.rollout.max_turns) == (0.0, 16)   # evaluation
    ds = _ds(ROOT / p.agent_grpo.deepspeed_config)
    assert ds.zero_optimization_stage == 3 and ds.bfloat16_config.enabled
    assert load_ds_config(ROOT / p.agent_grpo.deepspeed_config)["managed_gradient_accumulation"] is False
    sft = _ds(ROOT / p.agent_sft.deepspeed_config)               # the SFT batch splits over 16 ranks
    assert sft.train_batch_size % (sft.train_micro_batch_size_per_gpu * p.agent_sft.world_size) == 0


def test_rl_configs_own_the_accumulation_boundary():
    for path in (TINY_RL, PAPER / "ds_sim_rl.json", PAPER / "ds_agent_rl.json"):
        assert load_ds_config(path)["managed_gradient_accumulation"] is False
    assert load_params(ROOT / "params.yaml").sim_rl.deepspeed_config == "configs/tiny/ds_rl.json"


def test_paper_profile_only_overrides_existing_keys():
    def keys(d, prefix=""):
        return {f"{prefix}{k}" for k in d} | {x for k, v in d.items() if isinstance(v, dict)
                                               for x in keys(v, f"{prefix}{k}.")}
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    over = yaml.safe_load((PAPER / "params.paper.yaml").read_text())
    # a key of a phase section may also be one it takes from its shared group (midtrain.max_len: sft_run)
    known = keys(base) | keys(resolve_groups(base))
    assert keys(over) <= known, keys(over) - known


def test_hostfile_and_launch_recipe():
    from deepspeed.launcher.runner import _parse_hostfile

    lines = (PAPER / "hostfile.example").read_text().splitlines(keepends=True)
    pool = _parse_hostfile(lines)
    assert sum(pool.values()) == 32 and len(pool) == 4
    readme = (PAPER / "README.md").read_text()
    assert "deepspeed --hostfile" in readme and "--module mimesis_lab.jobs.sft" in readme


def test_ds_config_rejects_an_optimizer_or_bad_json(tmp_path):
    with_opt = tmp_path / "opt.json"
    with_opt.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW"}}))
    with pytest.raises(TrainConfigError, match="`optimizer` must not be set"):
        load_ds_config(with_opt)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(TrainConfigError, match="invalid JSON"):
        load_ds_config(broken)
    with pytest.raises(TrainConfigError, match="cannot read"):
        load_ds_config(tmp_path / "missing.json")
