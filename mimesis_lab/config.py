"""Validated configuration: one pydantic model per ``params.yaml`` section.

``params.yaml`` is the single source of truth. Every field carries a help text
(``Field(description=...)``), unknown keys are errors, and types are strict
(``"1"`` is not an int). :func:`load_params` turns any problem into a
:class:`ConfigError` whose message names the file and the dotted key.

Settings that sibling phases share are written once, in a shared group (:data:`SHARED_GROUPS`:
``sft_run`` for midtrain/sft/agent_sft, ``agent_rl`` for agent_grpo/agent_csd), and merged under
each phase section before validation (:mod:`mimesis_lab.config_groups`), so ``params.agent_csd.lr``
is complete. The help (``--explain KEY``, the ``#:`` comments of params.yaml) is generated from the
descriptions (:mod:`mimesis_lab.config_help`). Shared sub-sections live in
:mod:`mimesis_lab.config_base`, the evaluation sections in :mod:`mimesis_lab.config_eval`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mimesis_lab import config_groups, config_help
from mimesis_lab.config_base import (AgentRolloutParams, ConfigError, JudgeParams, OpenAIEndpoint,  # noqa: F401
                                     RolloutParams, Schema, Section, SharedGroup)
from mimesis_lab.config_eval import (AgentEvalParams, DiscriminatorParams, EvalPartnerParams,  # noqa: F401
                                     EvalSimulatorParams, EvalUserParams, ReportParams, SimEvalParams)
from mimesis_lab.envs.gyms.registry import ALL_GYMS, TRAIN_GYMS
from mimesis_lab.world.params import WorldParams


def yaml_load(text: str) -> Any:
    """``yaml.safe_load`` through libyaml's C loader when PyYAML has it (about 8x faster on ``dvc.lock``; the
    same safe schema), the pure-Python loader otherwise."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - a safe loader

DEFAULT_PARAMS = Path("params.yaml")


class TrackingParams(Section):
    enabled: bool = Field(True, description="Record stage and training runs in MLflow.")
    tracking_uri: str = Field(
        "sqlite:///mlflow/mlflow.db",
        description="MLflow tracking URI; relative sqlite paths are resolved against the project root.",
    )
    artifact_location: str = Field(
        "mlflow/artifacts", description="Artifact root for newly created experiments (relative to project root)."
    )
    experiment: str = Field("mimesis", description="MLflow experiment that every run of this pipeline is logged to.")
    simulator_model: str = Field("mimesis-simulator", description="Registered-model name of the simulator "
                                 "checkpoints (one version per phase run, the phase as alias).")
    agent_model: str = Field("mimesis-agent", description="Registered-model name of the agent checkpoints.")


class RoleSwapParams(Section):
    mixture: dict[str, float] = Field(
        description="Source mixture as `glob: ratio`. Each entry is one source: a file is named by its stem; a glob "
        "or folder (e.g. WildChat's parquet shards) by its last path component without a wildcard, layout folders "
        "(data, default, train, test, validation, parquet, shards) skipped (WildChat-1M/data/train-*.parquet -> "
        "WildChat-1M), and its files are sampled together. ratio <= 1 samples round(ratio*n) conversations without replacement; ratio > 1 samples "
        "round(ratio*n) with replacement (seeded)."
    )
    no_swap_sources: list[str] = Field(
        default_factory=list,
        description="Source names (see mixture) routed to the no-swap processor: their assistant turns stay the "
        "target (human-LLM, theory-of-mind, social-reasoning and distillation sets).",
    )
    seed: int = Field(1234, description="Seed for mixture sampling and the final shuffle.")
    markup: Literal["quarantine", "clean"] = Field(
        "quarantine", description="Public text holding a chat-template token or think tag (<|im_start|>, "
        "<|im_end|>, <|endoftext|>, <think>, </think>) in any turn: `quarantine` the conversation (with the field), or "
        "`clean`: strip the tokens and keep it (a human turn left empty is then quarantined as empty); the "
        "metrics count the cleaned rows (markup_cleaned).")
    max_message_chars: int = Field(
        32_000, gt=0, description="Messages longer than this are quarantined as oversize (whole conversation)."
    )
    chunk_mb: float = Field(
        16.0, gt=0, description="Input is read and transformed in chunks of about this many MiB of whole lines, "
        "and spilled to parquet parts, so memory stays bounded whatever the corpus size.")
    output: str = Field("data/processed/role_swap.parquet", description="Output parquet path.")

    @field_validator("mixture")
    @classmethod
    def _ratios_positive(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("mixture must name at least one `glob: ratio` entry")
        for glob, ratio in v.items():
            if not ratio > 0:
                raise ValueError(f"ratio for {glob!r} must be > 0, got {ratio}")
        return v


class ThoughtTraceParams(Section):
    input: str = Field("data/raw/thoughttrace/thoughttrace.jsonl", description="ThoughtTrace JSONL file (glob allowed).")
    include_reactions: bool = Field(
        False,
        description="Append the user's reaction to the previous AI reply into the <think> block "
        "(the paper used reasons only: off).",
    )
    max_message_chars: int = Field(32_000, gt=0, description="Messages longer than this quarantine the conversation.")
    markup: Literal["quarantine", "clean"] = Field(
        "quarantine", description="Public text holding a chat-template token or think tag (<|im_start|>, "
        "<|im_end|>, <|endoftext|>, <think>, </think>) in a message or in a reason/reaction note: `quarantine` the conversation (with the field), or "
        "`clean`: strip the tokens and keep it (a human turn left empty is then quarantined as empty); the "
        "metrics count the cleaned rows (markup_cleaned).")
    chunk_mb: float = Field(16.0, gt=0, description="Input is processed in chunks of about this many MiB (bounded memory).")
    output: str = Field("data/processed/thoughttrace.parquet", description="Output parquet path.")


class BehaviorsParams(Section):
    """Behaviour annotation of ThoughtTrace (SPEC §2.4, taxonomy building): the annotations and their
    in-sample frequency table."""

    annotator: Literal["rule", "openai"] = Field(
        "rule", description="`rule`: deterministic transparent cues (offline default); `openai`: LLM annotator."
    )
    openai: OpenAIEndpoint = Field(default_factory=OpenAIEndpoint, description="Endpoint for the `openai` annotator.")
    annotations_output: str = Field("data/processed/behavior_annotations.parquet", description="Annotation rows.")
    frequencies_output: str = Field("data/processed/behavior_frequencies.parquet", description="In-sample counts.")


class BehaviorTasksParams(Section):
    """Grounded ABCD behaviour-task rows for simulator RL (SPEC §2.4, the rollout input rows)."""

    abcd_input: str = Field("data/raw/abcd/abcd_v1.1.json", description="ABCD conversations ({train,dev,test} or a list).")
    kb: str = Field("data/raw/abcd/kb.json", description="ABCD kb.json: subflow -> required action buttons.")
    guidelines: str = Field("data/raw/abcd/guidelines.json", description="ABCD guidelines.json (agent manual).")
    neutral_share: float = Field(1 / 3, ge=0, le=1, description="Share of behaviour-task rows that are neutral.")
    turn_budget: int = Field(8, gt=0, description="Maximum simulated user turns per behaviour rollout.")
    seed: int = Field(1234, description="Seed for behaviour assignment.")
    output: str = Field("data/processed/behavior_tasks.parquet", description="ABCD behaviour-task rows.")


class SplitsParams(Section):
    fractions: dict[str, float] = Field(
        default_factory=lambda: {"train": 0.8, "val": 0.1, "test": 0.1},
        description="Split name -> fraction of rows; must sum to 1. Whole groups (user, conversation, ABCD "
        "scenario, connected across datasets) are assigned, so realised fractions are approximate.",
    )
    seed: int = Field(1234, description="Seed for the group shuffle.")
    datasets: dict[str, str] = Field(
        default_factory=lambda: {
            "role_swap": "data/processed/role_swap.parquet",
            "thoughttrace": "data/processed/thoughttrace.parquet",
            "behavior_tasks": "data/processed/behavior_tasks.parquet",
        },
        description="Dataset name -> parquet to split. Each must have `conversation_id` and `user_id`; "
        "`scenario_key` is used where present.",
    )
    output_dir: str = Field("data/splits", description="Writes <output_dir>/<dataset>/<split>.parquet.")

    @field_validator("fractions")
    @classmethod
    def _fractions_sum_to_one(cls, v: dict[str, float]) -> dict[str, float]:
        if not v or any(f < 0 for f in v.values()) or abs(sum(v.values()) - 1.0) > 1e-6:
            raise ValueError(f"fractions must be non-negative and sum to 1, got {v}")
        return v


class GymsParams(Section):
    """The UserRL rows of the agent gyms (SPEC §3.1): train on five gyms, evaluate on all eight."""

    tasks: dict[str, str | None] = Field(
        default_factory=lambda: {g: None for g in ALL_GYMS},
        description="Gym name -> task file (JSON) its rows are built from; null (or a gym left out) = the gym's "
        f"bundled file under data/raw/gyms/<gym>/. Gym names: {', '.join(ALL_GYMS)}.")
    train_gyms: list[str] = Field(
        default_factory=lambda: list(TRAIN_GYMS),
        description="Gyms whose tasks are split into train/val (agent training); every other gym is held out and "
        "all its tasks go to test.")
    val_fraction: float = Field(
        0.15, ge=0, lt=1, description="Share of each training gym's tasks in val: max(1, round(val_fraction * n)) "
        "tasks, and at least one task stays in train.")
    seed: int = Field(1234, description="Seed of the per-gym shuffle of task ids that picks the val tasks.")
    output_dir: str = Field("data/gyms", description="Writes <output_dir>/{train,val,test}.parquet.")
    userrl_rows: str | None = Field(
        None, description="UserRL's published gym rows to import instead of building rows from the task files: "
        "a folder (its *.parquet files, recursively) or a glob of parquet files. Their data_source names "
        "(interact_turtlegym…) are accepted, inline tasks (turtle, telepathy, persuade) read from create_kwargs, "
        "the others looked up in gyms.tasks.<gym>; UserRL's split is kept (held-out gyms: test; a training gym "
        "without val rows gets val_fraction of its train rows); every rejected row is quarantined with its "
        "reason. null = build the rows from gyms.tasks.")
    tau_db: str | None = Field(
        None, description="TauGym's retail database: tau-bench's data folder (users.json, orders.json, products.json; "
        "UserRL's real tau tasks act on it) or a db.json; null = the db.json beside the tau task file (the "
        "world's or the bundled one). A broken file fails naming it.")
    search_corpus: str | None = Field(
        None, description="SearchGym's local corpus (JSONL of {id, title, text}, one passage a line), indexed with "
        "BM25 (rank-bm25) for every search task; null = the passages.jsonl beside the search task file (when "
        "that file is missing, the gyms stage stops naming it and this key). A question whose answer occurs in "
        "no passage is reported as unanswerable.")

    def task_options(self, gym: str) -> dict[str, str]:
        """The extra arguments of ``registry.load_tasks(gym, path, **options)`` these params set
        (``db`` for tau, ``corpus`` for search; none when null)."""
        opts = {"tau": {"db": self.tau_db}, "search": {"corpus": self.search_corpus}}.get(gym, {})
        return {k: v for k, v in opts.items() if v is not None}

    @field_validator("tasks")
    @classmethod
    def _known_gyms(cls, v: dict[str, str | None]) -> dict[str, str | None]:
        unknown = sorted(set(v) - set(ALL_GYMS))
        if unknown:
            raise ValueError(f"unknown gym(s) {unknown}; known: {list(ALL_GYMS)}")
        return v

    @field_validator("train_gyms")
    @classmethod
    def _train_gyms_known(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("train_gyms must name at least one gym")
        unknown = [g for g in v if g not in ALL_GYMS]
        if unknown:
            raise ValueError(f"unknown gym(s) {unknown}; known: {list(ALL_GYMS)}")
        if len(set(v)) != len(v):
            raise ValueError(f"train_gyms has duplicates: {v}")
        return v

    @property
    def held_out_gyms(self) -> tuple[str, ...]:
        """Gyms not trained on (test only), in registry order."""
        return tuple(g for g in ALL_GYMS if g not in self.train_gyms)


class AgentTracesParams(Section):
    """Successful oracle traces of the training gyms: the agent's SFT warm start (SPEC §3.2)."""

    gyms_dir: str = Field("data/gyms", description="Output folder of the `gyms` stage ({train,val}.parquet are read).")
    show_reward: bool = Field(True, description="Append `Reward: r` to the tool feedback; must equal "
                              "agent_rl.rollout.show_reward so SFT and RL see the same interface.")
    max_steps: int | None = Field(
        None, ge=1, description="Gym steps per oracle episode, at most the agent's `max_turns` (checked); null: the "
        "agent's episode budget, the smaller of agent_grpo's and agent_csd's rollout.max_turns (16 when neither "
        "is configured).")
    explore_share: float = Field(0.25, ge=0, lt=1, description="Share of the output traces that are exploratory "
                                 "(rewarded but not the expert's best play: another question order, an extra "
                                 "question, an earlier answer), so RL has choices to weigh.")
    coached_share: float = Field(
        0.0, ge=0, le=1, description="Coached copies, at most this share of the oracle and exploratory traces, in "
        "pairs: where the expert's best play and an exploratory play of a task part ways after the same history, "
        "each cut after its turn with the template coach's note recommending that turn (a question to the user: "
        "`unmet`, naming its categories; the final answer: `ready`) as a user message before it, the layout of "
        "CSD's teacher rows (SPEC §3.3 item 4). Only the note tells a pair apart, so the warm start learns to read "
        "notes; CSD's teacher is the agent reading one, and an agent that never saw one ignores it. Only the gyms "
        "CSD coaches (not `agent_csd.csd.skip_gyms`); the notes are the template coach's sentences (use with "
        "`agent_csd.coach.kind: template`); 0: none (the paper's warm start).")
    seed: int = Field(0, description="Seed of the exploratory traces and of the offline user's vague replies.")
    output_dir: str = Field("data/agent_sft", description="Writes <output_dir>/{train,val}.parquet (column "
                            "`messages`: prompt, then alternating assistant replies and tool feedback).")


class ValidateParams(Section):
    report: str = Field("metrics/validate.json", description="Per-suite great-expectations results.")
    fail_on_error: bool = Field(True, description="Exit non-zero when any expectation fails.")


class TokenizerParams(Section):
    pretrained: str | None = Field(
        None, description="Local path of a Hugging Face checkpoint whose tokenizer (and chat template) is used "
        "instead of training one (paper profile). Never downloaded: HF_HUB_OFFLINE=1.")
    corpus: list[str] = Field(
        default_factory=lambda: ["data/splits/role_swap/train.parquet", "data/splits/thoughttrace/train.parquet"],
        description="Parquet files with a `messages` column whose text trains the byte-level BPE (train splits "
        "only: no validation text leaks into the vocabulary).")
    vocab_size: int = Field(4096, ge=300, description="Target vocabulary size of the trained BPE (incl. specials).")
    min_frequency: int = Field(2, ge=1, description="Minimum pair frequency for a BPE merge.")
    output_dir: str = Field("models/tokenizer", description="Hugging Face tokenizer folder written by the stage.")


class ModelParams(Section):
    init: Literal["tiny", "pretrained"] = Field(
        "tiny", description="`tiny`: a Qwen3-architecture model built from the fields below (random init); "
        "`pretrained`: load the local checkpoint at `pretrained_path`.")
    pretrained_path: str | None = Field(None, description="Local HF checkpoint folder (required for `pretrained`).")
    hidden_size: int = Field(128, gt=0, description="Hidden size of the tiny model (<= 128 in the tiny profile).")
    intermediate_size: int = Field(384, gt=0, description="MLP width of the tiny model.")
    num_hidden_layers: int = Field(2, gt=0, description="Transformer layers of the tiny model.")
    num_attention_heads: int = Field(4, gt=0, description="Attention heads.")
    num_key_value_heads: int = Field(2, gt=0, description="Key/value heads (grouped-query attention).")
    head_dim: int = Field(32, gt=0, description="Per-head dimension.")
    max_position_embeddings: int = Field(2048, gt=0, description="Maximum sequence length (RoPE table).")
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base.")
    tie_word_embeddings: bool = Field(True, description="Share input and output embeddings.")
    seed: int = Field(1234, description="Seed of the random initialisation.")
    induction_warmup_steps: int = Field(
        0, ge=0, description="`tiny` only: optimizer steps of the induction warm-up run on the fresh model before any "
        "data (random-token spans repeated after a random gap; loss on the repeat), which gives it in-context "
        "copying (induction heads) as pretraining gives a real checkpoint; 0 = off. "
        "See mimesis_lab.models.induction_warmup.")
    induction_warmup_target: float = Field(
        0.0, ge=0, le=1, description="Stop the induction warm-up early once the copy probe (30-token spans, "
        "mimesis_lab.evals.copy_probe) reaches this accuracy, checked every 100 steps; induction_warmup_steps is "
        "then the most it runs; 0 = run every step.")
    induction_warmup_lr: float = Field(3e-3, gt=0, description="AdamW learning rate of the induction warm-up.")
    induction_warmup_batch: int = Field(32, gt=0, description="Sequences per induction warm-up step.")
    induction_warmup_max_gap: int = Field(
        32, ge=0, description="Largest number of random tokens between a span and its repeat in the induction "
        "warm-up (the gap is drawn per step in [0, max_gap]).")

    @model_validator(mode="after")
    def _pretrained_needs_path(self) -> "ModelParams":
        if self.init == "pretrained" and not self.pretrained_path:
            raise ValueError("model.init = pretrained needs model.pretrained_path")
        return self


class TrainParams(Section):
    """One training phase (``midtrain``, ``sft`` or ``agent_sft``) run by the shared DeepSpeed loop."""

    @model_validator(mode="before")
    @classmethod
    def _packing_alias(cls, data: Any) -> Any:
        """The deprecated ``packing: true|false`` (before ``batching``) means ``batching: packed|padded``."""
        if isinstance(data, dict) and "packing" in data:
            data = dict(data)
            packing = data.pop("packing")
            if "batching" in data:
                raise ValueError("`packing` is deprecated and replaced by `batching`: write only `batching`")
            if not isinstance(packing, bool):
                raise ValueError(f"`packing` (deprecated) must be true or false, got {packing!r}; use `batching`")
            data["batching"] = "packed" if packing else "padded"
        return data

    train: str = Field(description="Training split parquet (column `messages`; `copies` expands the mixture).")
    val: str = Field(description="Validation split parquet.")
    init_from: str = Field(
        description="`model` to build/load per the model section, or a folder with a Hugging Face model "
        "(e.g. the previous phase's `final/`).")
    train_role: Literal["assistant", "user"] = Field(
        "assistant", description="Role whose content tokens get loss mask 1 (after the role swap the human "
        "turns sit in the assistant slot).")
    deepspeed_config: str = Field(
        description="DeepSpeed JSON (ZeRO stage, micro-batch, gradient accumulation, clipping, precision).")
    max_len: int = Field(512, gt=8, description="Tokens per packed row (and per example); with `grouped` "
                         "batching, a micro-batch holds at most micro_batch x max_len padded tokens.")
    overlong: Literal["truncate", "drop"] = Field(
        "truncate", description="An example longer than max_len is truncated (right) or dropped; both counted.")
    batching: Literal["auto", "packed", "grouped", "padded"] = Field(
        "auto", description="How examples make micro-batches. `packed`: several examples per max_len row, "
        "block-diagonal attention; `grouped`: length-grouped dynamic padding (HF/TRL group_by_length: "
        "seeded shuffle, mega-batches sorted by length), a micro-batch holding up to micro_batch x max_len "
        "padded tokens, each example padded only to the longest of its micro-batch; `padded`: one example "
        "per row padded to max_len; `auto`: packed on CUDA, grouped on CPU (faster there: "
        "bench/bench_packing.py). The deprecated `packing: true|false` means packed|padded.")
    epochs: float = Field(1.0, gt=0, description="Passes over the (mixture-expanded) training set.")
    max_steps: int | None = Field(None, gt=0, description="Stop after this many optimizer steps (overrides epochs).")
    lr: float = Field(1e-3, gt=0, description="Peak learning rate (AdamW).")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine decays to lr * min_lr_ratio.")
    warmup_ratio: float = Field(0.05, ge=0, lt=1, description="Share of steps with linear warm-up.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1.")
    beta2: float = Field(0.95, ge=0, lt=1, description="AdamW beta2.")
    eval_every: int = Field(20, gt=0, description="Validation loss every N optimizer steps (and at the end).")
    initial_eval: bool = Field(True, description="Validation loss before the first step too: the summary's "
                               "initial_val_loss (the midtrain loss effect reads it); false saves one evaluation.")
    save_every: int = Field(20, gt=0, description="Checkpoint every N optimizer steps (the last step too where the "
                            "export reads its checkpoint: ZeRO-3 or bf16/fp16; else `final/` is written from the "
                            "engine).")
    keep_last: int = Field(2, ge=1, description="Checkpoints kept on disk.")
    resume: str = Field("auto", description="`auto`: resume from the latest checkpoint if any; `never`; or a path.")
    world_size: int = Field(1, ge=1, description="Processes launched (CPU: gloo); ZeRO checkpoints are tied to it.")
    launcher: Literal["deepspeed", "torchrun", "direct"] = Field("deepspeed", description="Launcher used for the job: `direct` (world_size 1 only) starts the job module itself, no launcher process; `torchrun` starts one agent process (a no-op job: 3.6 s against 9.2 s under `deepspeed` on 2 CPU cores, bench/bench_overhead.py); `deepspeed` runs the DeepSpeed runner (hostfiles, multi-node). DeepSpeed does the training in every case.")
    seed: int = Field(1234, description="Data order and dropout seed.")
    output_dir: str = Field(description="Checkpoints (`checkpoints/`) and the final HF folder (`final/`).")
    log_every: int = Field(1, gt=0, description="Log loss/lr/grad-norm/tokens-per-s every N steps.")
    history: Literal["full", "public"] = Field(
        "full", description="What each trained turn sees of its own earlier turns. `public`: their public text, "
        "think blocks removed, as the simulator's history holds them in simulator RL and in the gyms (SPEC §1: "
        "u(x | c, H) with H the public history); each conversation is one prefix-tree row (the shared history "
        "encoded once, ~1.1x the tokens). `full`: the conversation verbatim, earlier reasoning included (one "
        "causal row).")
    format_unlikelihood: float = Field(
        0.0, ge=0, description="Weight of a format unlikelihood term (Welleck et al., 2020): -log(1 - p) of "
        "`</think>` and `<think>` at every target token past the reply's `</think>`, a token sum normalised like "
        "the CE. It targets the tiny model's main format failure, a second `</think>` after an utterance that "
        "repeats its reasoning (in-context copying carries the tag along); 0 = off.")
    induction_rehearsal: float = Field(
        0.0, ge=0, description="Weight of an induction-task loss (mimesis_lab.models.induction_loss: random spans "
        "repeated after a gap) added to every optimizer step, so fine-tuning keeps the in-context copying that "
        "the induction warm-up gave the tiny model (midtrain at lr 5e-3 erases it otherwise); 0 = off.")
    induction_rehearsal_batch: int = Field(8, gt=0, description="Induction sequences per optimizer step of the "
                                           "rehearsal (spans 8-40 tokens, gaps 0-32).")
    token_cache: bool = Field(True, description="Keep the tokenised splits in <output_dir>/token_cache (keyed by "
                              "the tokenizer files, the split files and the tokenisation settings; another key is "
                              "rebuilt): a rerun reads them instead of tokenising, and at world size > 1 only rank 0 "
                              "tokenises. Operational: not part of the run's identity.")


class SimTaskParams(Section):
    """One simulator task of the joint RL mixture (SPEC §2.3)."""

    weight: float = Field(ge=0, description="Sampling weight p(d) (normalised over the tasks).")
    data: str = Field(description="Split parquet the task rows are built from (behaviour tasks or ThoughtTrace).")
    turn_budget: int | None = Field(None, gt=0, description="Simulator turns per episode (null: the row's/task's own).")
    max_rows: int | None = Field(None, gt=0, description="Use at most this many task rows (null: all).")


class RLPhaseParams(Section):
    """Settings shared by the RL phases (``sim_rl``, ``agent_grpo``): batch shape, PPO-clip update,
    optimizer, checkpoints and launch."""

    deepspeed_config: str = Field(description="DeepSpeed JSON for the policy update.")
    steps: int = Field(gt=0, description="RL steps (one rollout batch + its updates each).")
    prompts_per_step: int = Field(gt=0, description="Task rows sampled per step (groups).")
    rollouts_per_prompt: int = Field(ge=2, description="Rollouts per task row (group size).")
    ppo_epochs: int = Field(1, ge=1, description="Passes over each rollout batch.")
    minibatches: int = Field(1, ge=1, description="Optimizer steps per pass (the batch's rows split evenly).")
    micro_rows: int = Field(8, ge=1, description="Rows (simulator rollouts or segments, see sim_rl.encode; agent "
                            "trajectories) per forward/backward (gradient accumulation inside a minibatch).")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO clip epsilon.")
    kl_coef: float = Field(0.0, ge=0, description="Weight of a KL penalty to the initial policy (`init_from`, "
                           "kept frozen): L = L_PPO + kl_coef * L_KL, the k3 estimator exp(d) - d - 1 with "
                           "d = log pi_ref - log pi_theta on the trained tokens (verl's low_var_kl, TRL's GRPO beta); "
                           "one extra forward without gradient per micro-chunk. 0 = the paper (no KL; nothing "
                           "loaded). Logged as update/kl_ref.")
    ptx_coef: float = Field(0.0, ge=0, description="Weight of a replay loss on demonstrations (InstructGPT's "
                            "PPO-ptx, OpenRLHF's ptx_coef): each optimizer step adds ptx_coef * L_SFT, the token "
                            "mean cross-entropy of the policy on `ptx_rows` conversations drawn from `ptx_data` "
                            "(assistant turns trained, as in the SFT phases), so skills the RL signal does not "
                            "reach are kept. 0 = the paper (off; nothing loaded). Logged as update/ptx_loss.")
    ptx_data: str | None = Field(None, description="Parquet with a `messages` column (e.g. the warm start's "
                                 "training split, data/agent_sft/train.parquet) replayed when ptx_coef > 0.")
    ptx_rows: int = Field(4, ge=1, description="Replayed conversations per optimizer step (ptx_coef > 0).")
    adv_eps: float = Field(1e-6, gt=0, description="Group-normalisation epsilon in (r - mean)/(std + eps).")
    lr: float = Field(1e-5, gt=0, description="Peak learning rate (AdamW).")
    min_lr_ratio: float = Field(1.0, ge=0, le=1, description="Cosine decays to lr * min_lr_ratio (1: constant).")
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="Share of steps with linear warm-up.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1.")
    beta2: float = Field(0.99, ge=0, lt=1, description="AdamW beta2.")
    save_every: int = Field(10, gt=0, description="Checkpoint every N steps (the last step too where the export "
                            "reads its checkpoint: ZeRO-3 or bf16/fp16; else `final/` is written from the engine).")
    keep_last: int = Field(2, ge=1, description="Checkpoints kept on disk.")
    resume: str = Field("auto", description="`auto`, `never` or a checkpoint path (as for the SFT jobs).")
    world_size: int = Field(1, ge=1, description="Processes launched; each rolls out its share of the groups.")
    launcher: Literal["deepspeed", "torchrun", "direct"] = Field("deepspeed", description="Launcher used for the job: `direct` (world_size 1 only) starts the job module itself, no launcher process; `torchrun` starts one agent process (a no-op job: 3.6 s against 9.2 s under `deepspeed` on 2 CPU cores, bench/bench_overhead.py); `deepspeed` runs the DeepSpeed runner (hostfiles, multi-node). DeepSpeed does the training in every case.")
    seed: int = Field(1234, description="Row sampling, rollout sampling and update seed.")
    log_every: int = Field(1, gt=0, description="Log every N steps.")

    @model_validator(mode="after")
    def _ptx_needs_data(self) -> "RLPhaseParams":
        if self.ptx_coef > 0 and not self.ptx_data:
            raise ValueError("ptx_coef > 0 needs ptx_data (a parquet with a `messages` column to replay)")
        return self


class SimRLParams(RLPhaseParams):
    """Joint multi-domain simulator RL with FoldGRPO (SPEC §2.3–2.4, §6)."""

    init_from: str = Field(description="Hugging Face folder of the starting policy (the SFT model).")
    tasks: dict[str, SimTaskParams] = Field(description="The joint multi-domain mixture: data_source -> its "
                                            "weight p(d), rows and turn budget; tasks are sampled by weight.")
    kb: str = Field("data/raw/abcd/kb.json", description="ABCD kb.json for the scripted support agent.")
    guidelines: str = Field("data/raw/abcd/guidelines.json", description="ABCD guidelines.json.")
    judge: JudgeParams = Field(default_factory=JudgeParams, description="Behaviour judge.")
    rollout: RolloutParams = Field(default_factory=RolloutParams, description="Rollout generation.")
    require_think: bool = Field(True, description="Thinking on: a reply without `<think>…</think>utterance` is a "
                                "format failure (update reward 0, raw score still logged).")
    invalid_policy: Literal["exclude", "zero"] = Field(
        "exclude", description="`exclude`: invalid rollouts leave the group statistics (counted per reason); "
        "`zero`: the reference behaviour, an invalid rollout scores 0 and stays in the group.")
    encode: Literal["trajectory", "turn"] = Field(
        "trajectory", description="Update rows: `trajectory`, one prefix-tree row per rollout (history tokens "
        "shared by its turns encoded once, a 4D attention mask; needs sdpa or eager attention); `turn`, one row "
        "per simulator turn (its whole prompt re-encoded). Same loss and gradient; bench/bench_sim_update.py.")
    row_order: Literal["uniform", "stratified"] = Field(
        "uniform", description="How a sampled task's row is picked. `uniform`: uniformly with replacement, "
        "independently per draw (the reference). `stratified`: the next row of a shuffled pass over the task's "
        "rows in which each behaviour (the row's `behavior_ids`) is spread evenly, so every window of steps "
        "holds the behaviours and the neutral control in the data's proportions (jobs/sim_rl.py: "
        "stratified_order); each row is still drawn equally often.")
    output_dir: str = Field("models/sim_rl", description="Checkpoints, rollouts.jsonl, metrics.jsonl, final/.")
    save_rollouts: bool = Field(True, description="Write every episode (public/private log, score, validity) to "
                                "output_dir/rollouts.jsonl.")

    @field_validator("tasks")
    @classmethod
    def _some_weight(cls, v: dict[str, SimTaskParams]) -> dict[str, SimTaskParams]:
        if not v or sum(t.weight for t in v.values()) <= 0:
            raise ValueError("sim_rl.tasks needs at least one task with a positive weight")
        return v


class AgentUserParams(Section):
    """The user side of the gyms: the frozen simulator, always behind the privileged shim."""

    kind: Literal["simulator", "openai"] = Field(
        "simulator", description="`simulator`: serve `model_path` in-process (OpenAI-compatible, CPU/GPU); "
        "`openai`: an external OpenAI-compatible server at `openai.base_url` (e.g. `vllm serve`).")
    model_path: str = Field("models/sim_rl/final", description="Simulator checkpoint for kind `simulator`.")
    openai: OpenAIEndpoint = Field(default_factory=lambda: OpenAIEndpoint(model="simulator"),
                                   description="External simulator endpoint for kind `openai`.")
    max_new_tokens: int = Field(64, ge=1, description="Tokens per simulated user reply.")
    temperature: float = Field(1.0, ge=0, description="Simulator sampling temperature.")
    timeout_s: float = Field(60.0, gt=0, description="Per-reply timeout (a timeout makes the episode invalid).")
    format_retries: int = Field(
        0, ge=0, description="Resample a reply that is not a well-formed `<think>…</think>utterance` up to this "
        "many times (new seed, nothing stored) before it counts as the turn; counted per step as "
        "`user/format_resamples` and `user/format_recovered`. 0 = every reply is final.")
    format_resample_batch: int = Field(
        1, ge=1, description="Send the format resamples this many at a time, concurrently (seeds k … k+B-1 in "
        "one upstream batch), keeping the first well-formed one in seed order: the same replies and counters as "
        "one at a time, in fewer generation rounds; the samples drawn but not needed are counted as "
        "`user/format_speculative`. 1 = one at a time.")
    think_format: bool = Field(
        False, description="Decode the simulator's replies under the `<think>reasoning</think>utterance` grammar "
        "(mimesis_lab.rollout.think_guide): the model writes every token, the grammar only masks what the format "
        "forbids and closes a think block that would leave no room for the utterance. Kind `simulator`: counted per "
        "step as `user/guided_replies`, `user/guided_tokens` and `user/guided_forced_close`. Kind `openai`: sent as "
        "the request field `think_format`, which our server (`python -m mimesis_lab.rollout.serve`) honours and "
        "other servers ignore (`user/format_failures` then shows the raw model's failures). Off = the raw model, "
        "format failures and resamples as they come.")


class AgentGRPOParams(RLPhaseParams):
    """Multi-turn GRPO of the agent against the frozen simulator (SPEC §3.1–3.2)."""

    init_from: str = Field(description="Hugging Face folder of the starting agent.")
    data: str = Field("data/gyms/train.parquet", description="UserRL rows of the `gyms` stage.")
    gyms: dict[str, float] = Field(default_factory=lambda: {g: 1.0 for g in ("travel", "turtle", "function", "tau",
                                                                             "persuade")},
                                   description="Training gym -> sampling weight.")
    user: AgentUserParams = Field(default_factory=AgentUserParams, description="The simulated user.")
    rollout: AgentRolloutParams = Field(default_factory=AgentRolloutParams, description="Agent generation.")
    gamma: float = Field(0.8, ge=0, le=1, description="R2G discount of the turn credit.")
    zero_credit: Literal["uniform", "zero"] = Field(
        "uniform", description="All-zero credit: `uniform` spreads A_i (failures keep their signal); `zero` = "
        "the reference (no signal).")
    invalid_policy: Literal["exclude", "zero"] = Field("exclude", description="As in sim_rl.")
    output_dir: str = Field("models/agent_grpo", description="Checkpoints, rollouts.jsonl, metrics.jsonl, final/.")
    save_rollouts: bool = Field(True, description="Write every trajectory to output_dir/rollouts.jsonl.")
    sibling_jobs: Literal["sequential", "concurrent"] = Field(
        "sequential", description="When one flow run trains both agent_grpo and agent_csd (the `agent_rl` DVC "
        "stage): `concurrent` starts the two jobs at once, each with 1/2 of the CPU threads (OMP_NUM_THREADS = "
        "cores // (2 * world_size)); `sequential` runs them one after the other with every thread. The same "
        "steps, seeds and data either way (the thread count changes float summation order only). Both phases "
        "must say `concurrent`.")


class CoachParams(Section):
    """The coach ``h_t = G(H_t, y_t, z_t, x_{t+1})`` (SPEC §3.3 item 3)."""

    kind: Literal["template", "openai"] = Field(
        "template", description="`template`: offline deterministic cue rules (default); `openai`: an "
        "OpenAI-compatible endpoint, which must be a different server from the simulator's (checked at start).")
    style: Literal["prospective", "corrective"] = Field(
        "prospective", description="`prospective` does not see the agent's reply; `corrective` does.")
    openai: OpenAIEndpoint = Field(default_factory=lambda: OpenAIEndpoint(base_url="http://127.0.0.1:8001/v1",
                                                                          model="coach"),
                                   description="Coach endpoint for kind `openai`.")


class CSDParams(Section):
    """Coached on-policy self-distillation (SPEC §3.3): ``L = L_GRPO + alpha * L_CSD``."""

    alpha: float = Field(0.01, ge=0, description="Weight of the CSD loss (0 = plain GRPO, the baseline).")
    beta: float = Field(5.0, ge=0, description="Gate sharpness: g = sigmoid(beta * delta).")
    placebo: bool = Field(True, description="Placebo correction: delta = teacher - teacher[placebo note].")
    placebo_min_pool: int = Field(8, ge=2, description="Valid notes pooled before placebo rows are drawn.")
    turns_per_trajectory: int = Field(2, ge=1, description="Agent turns coached per trajectory (turns with "
                                      "preceding simulator reasoning first).")
    require_reply: bool = Field(False, description="Coach only turns whose preceding simulator reasoning exists "
                                "(the reference default is off).")
    skip_gyms: list[str] = Field(default_factory=lambda: ["tau", "function"],
                                 description="Gyms that cannot be episode-scoped (the reference skips Tau, Function).")
    leak_check: bool = Field(True, description="Drop notes that reveal the episode's private facts (hidden task "
                             "spec) before they reach a teacher row.")
    max_teacher_tokens: int = Field(2304, gt=16, description="Teacher rows wider than this are skipped (counted).")
    teacher_cache: bool = Field(True, description="Score only each teacher row's note + response on top of the "
                                "student forward's KV cache of the shared history (false: score the full rows).")
    coach: CoachParams = Field(default_factory=CoachParams, description="The coach.")


class AgentCSDParams(AgentGRPOParams):
    """Multi-turn GRPO + CSD (SPEC §3.3); every other field as in ``agent_grpo`` (both read ``agent_rl``)."""

    csd: CSDParams = Field(default_factory=CSDParams, description="The CSD term.")
    output_dir: str = Field("models/agent_csd", description="Checkpoints, rollouts.jsonl, metrics.jsonl, final/.")


class WorldSection(WorldParams):
    """The seeded synthetic world (``mimesis_lab.world``): one user population from which every raw
    input of the default pipeline is drawn. Real data bypasses it: point the stages' inputs elsewhere."""

    output_dir: str = Field("data/world", description="Where the world's raw files are written (chats/, "
                            "thoughttrace/, abcd/, gyms/, world/).")


class Params(Section):
    """The whole ``params.yaml``, its shared groups resolved into the phase sections (:data:`SHARED_GROUPS`)."""

    tracking: TrackingParams = Field(default_factory=TrackingParams, description="MLflow tracking.")
    world: WorldSection | None = Field(None, description="The seeded synthetic world (the default raw data).")
    role_swap: RoleSwapParams = Field(description="User-side mid-training data (role swap).")
    thoughttrace: ThoughtTraceParams = Field(default_factory=ThoughtTraceParams, description="ThoughtTrace SFT data.")
    behaviors: BehaviorsParams = Field(default_factory=BehaviorsParams, description="Behaviour annotation of ThoughtTrace.")
    behavior_tasks: BehaviorTasksParams = Field(default_factory=BehaviorTasksParams,
                                                description="Grounded ABCD behaviour-task rows.")
    splits: SplitsParams = Field(default_factory=SplitsParams, description="Leakage-safe grouped splits.")
    gyms: GymsParams = Field(default_factory=GymsParams, description="UserRL rows of the agent gyms.")
    tokenizer: TokenizerParams = Field(default_factory=TokenizerParams, description="Tokenizer stage.")
    model: ModelParams = Field(default_factory=ModelParams, description="Simulator model architecture/checkpoint.")
    midtrain: TrainParams | None = Field(None, description="User-side mid-training (role-swapped chats).")
    sft: TrainParams | None = Field(None, description="ThoughtTrace SFT (reasoning + utterance).")
    sim_rl: SimRLParams | None = Field(None, description="Joint multi-domain simulator RL (FoldGRPO).")
    agent_traces: AgentTracesParams = Field(default_factory=AgentTracesParams,
                                            description="Oracle traces for the agent SFT warm start.")
    agent_sft: TrainParams | None = Field(None, description="Agent SFT on successful oracle traces (warm start).")
    agent_grpo: AgentGRPOParams | None = Field(None, description="Agent multi-turn GRPO against the simulator.")
    agent_csd: AgentCSDParams | None = Field(None, description="Agent GRPO + coached self-distillation (CSD).")
    sim_eval: SimEvalParams | None = Field(None, description="Simulator benchmarks (SPEC §4.1).")
    agent_eval: AgentEvalParams | None = Field(None, description="Agent evaluation across gyms and users (§4.2).")
    report: ReportParams | None = Field(None, description="The comparison report.")
    validate_: ValidateParams = Field(
        default_factory=ValidateParams, alias="validate", description="great-expectations validation."
    )

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _no_swap_names_are_plain(self) -> "Params":
        for name in self.role_swap.no_swap_sources:
            if "/" in name or name.endswith(".jsonl"):
                raise ValueError(f"role_swap.no_swap_sources entries are source names (a file's stem, a glob's or folder's last path component), got {name!r}")
        for phase in ("agent_grpo", "agent_csd"):
            rl = getattr(self, phase)
            if rl is not None and rl.rollout.show_reward != self.agent_traces.show_reward:
                raise ValueError(f"agent_traces.show_reward ({self.agent_traces.show_reward}) must equal the agent "
                                 f"rollouts' show_reward ({phase}: {rl.rollout.show_reward}; written in "
                                 "agent_rl.rollout unless the phase overrides it): the SFT traces and the RL rollouts "
                                 "must show the agent the same tool feedback")
        return self


#: Shared groups: group section -> the phase sections it is merged under. A phase section holds
#: what differs and may override any key of its group (a deliberate ablation writes the key there).
SHARED_GROUPS: dict[str, SharedGroup] = {
    "sft_run": SharedGroup(("midtrain", "sft", "agent_sft"), "Settings shared by the SFT-style phases midtrain, "
                           "sft and agent_sft (loss mask, lengths, optimizer, schedule, checkpoints, launch); each "
                           "phase section holds what differs and may override any key written here."),
    "agent_rl": SharedGroup(("agent_grpo", "agent_csd"), "Settings shared by the two agent RL runs, agent_grpo "
                            "and agent_csd (initial agent, data, user, rollout, update, launch): written once, so "
                            "the runs are siblings by construction. A phase section may override a key (ablation)."),
}
#: Keys a shared group must not hold: two phases writing one folder would overwrite each other.
PER_PHASE_KEYS = ("output_dir",)


#: What the group merge and the generated help know of ``params.yaml``.
SCHEMA = Schema(Params, SHARED_GROUPS, PER_PHASE_KEYS)


def resolve_groups(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a params mapping as written) with each shared group merged under its member phase
    sections and removed: every phase section complete, as ``parse_params`` validates it. Scripts that
    edit a phase's settings in the mapping start from this form. A file without groups is returned as is."""
    return config_groups.resolve(data, SCHEMA)[0]


def override_target(data: dict[str, Any], key: str) -> str:
    """Where an override of the dotted ``key`` belongs in ``data`` (a params mapping as written): a
    setting a phase takes from its shared group is written to the group (``agent_csd.lr`` ->
    ``agent_rl.lr``), so the group's phases keep sharing it; a key the phase section writes itself
    (a deliberate override) or one that is not shared (``agent_csd.csd.alpha``) stays as given."""
    return config_groups.override_target(data, key, SCHEMA)


def _format_error(path: Path, err: ValidationError, origins: dict[tuple, tuple] | None = None) -> str:
    """One line per problem, naming the key where it is written; a shared group's key that fails in
    several phases is named once (an unknown key that only some phases reject says which)."""
    origins = origins or {}
    lines: dict[str, tuple[bool, set[str]]] = {}     # line -> (unknown key?, phases the group key failed in)
    for e in err.errors():
        loc = tuple(str(p) for p in e["loc"])
        written = config_groups.written_at(loc, origins)
        key = ".".join(written)
        if not loc:
            line = f"{path}: {e['msg']}"
        elif e["type"] == "extra_forbidden":
            line = f"{path}: unknown key `{key}`"
        else:
            got = repr(e.get("input"))
            got = got if len(got) <= 200 else got[:200] + "…"
            line = f"{path}: `{key}`: {e['msg']} (got {got})"
        unknown, phases = lines.setdefault(line, (e["type"] == "extra_forbidden", set()))
        phases.update([loc[0]] if written != loc else [])
    out = []
    for line, (unknown, phases) in lines.items():
        if unknown and phases:
            group = next(src[0] for dst, src in origins.items() if dst[0] in phases)
            merged_into = {dst[0] for dst, src in origins.items() if src[0] == group}
            if phases != merged_into:
                line += f" (not a key of {', '.join(sorted(phases))}: write it in the phase sections that have it)"
        out.append(line)
    return "\n".join(out)


def parse_params(data: Any, source: str | Path = "<params>") -> Params:
    """Resolve the shared groups (:func:`resolve_groups`), then validate; raise :class:`ConfigError`
    naming each bad key where it is written (``agent_rl.lr`` for a bad shared value)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    resolved, origins = config_groups.resolve(data, SCHEMA, source)
    try:
        return Params.model_validate(resolved)
    except ValidationError as err:
        raise ConfigError(_format_error(Path(str(source)), err, origins)) from None


def load_params(path: str | Path = DEFAULT_PARAMS) -> Params:
    """Load and validate ``params.yaml``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read params file: {e}") from None
    try:
        data = yaml_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    return parse_params(data, path)


def phase_params(params: Params, phase: str) -> Any:
    """``params.<phase>`` (the resolved section a flow runs), or a clear error when the file has none."""
    cfg = getattr(params, phase, None)
    if cfg is None:
        raise ValueError(f"params has no `{phase}` section")
    return cfg


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings to dotted keys (for MLflow params)."""
    out: dict[str, Any] = {}
    if isinstance(d, BaseModel):
        d = d.model_dump(by_alias=True)
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix.rstrip(".")] = d
    return out


def merge_profile(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge a profile (e.g. ``configs/paper/params.paper.yaml``) onto ``params.yaml`` data, both as
    written (shared groups unresolved: a profile's ``agent_rl`` lands on params.yaml's ``agent_rl``)."""
    out = dict(base)
    for k, v in overrides.items():
        out[k] = merge_profile(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def explain(key: str) -> str:
    """Type, default and description of a dotted key (``agent_rl.lr``, ``agent_csd.csd.alpha``)."""
    return config_help.explain(key, SCHEMA)


def annotate(text: str) -> str:
    """A params YAML with a generated ``#:`` comment (description, default) above each key."""
    return config_help.annotate(text, SCHEMA)


def main(argv: list[str] | None = None) -> int:
    """``python -m mimesis_lab.config [--params params.yaml] [--profile P.yaml ...] [-o out.yaml]``.

    Validates the params (with profiles merged on top, in order) and writes the merged
    file when ``-o`` is given; prints the errors, naming each key, otherwise.
    ``--explain KEY`` prints a key's type, default and description; ``--annotate FILE`` validates
    FILE and rewrites it with a ``#:`` comment above every key (run it after changing a description).
    """
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="mimesis_lab.config")
    ap.add_argument("--params", default=str(DEFAULT_PARAMS))
    ap.add_argument("--profile", action="append", default=[], help="profile YAML merged on top (repeatable)")
    ap.add_argument("-o", "--output", help="write the merged, validated params here")
    ap.add_argument("--explain", metavar="KEY", action="append", default=[],
                    help="print type, default and description of a dotted key, e.g. agent_rl.lr (repeatable)")
    ap.add_argument("--annotate", metavar="FILE", help="rewrite FILE (a params.yaml) with the generated comments")
    args = ap.parse_args(argv)
    if args.explain:
        try:
            print("\n\n".join(explain(k) for k in args.explain))
        except KeyError as e:
            print(f"error: {e.args[0]}", file=sys.stderr)
            return 2
        return 0
    if args.annotate:
        try:
            load_params(args.annotate)
            path = Path(args.annotate)
            path.write_text(annotate(path.read_text(encoding="utf-8")), encoding="utf-8")
        except (ConfigError, ValueError, KeyError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"annotated {args.annotate}")
        return 0
    try:
        data = yaml.safe_load(Path(args.params).read_text(encoding="utf-8"))
        for prof in args.profile:
            data = merge_profile(data, yaml.safe_load(Path(prof).read_text(encoding="utf-8")) or {})
        parse_params(data, " + ".join([args.params, *args.profile]))
    except (OSError, yaml.YAMLError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.output:
        Path(args.output).write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        print(f"wrote {args.output}")
    else:
        print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
