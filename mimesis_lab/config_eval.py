"""Validated params of the evaluation phases: ``sim_eval``, ``agent_eval`` and ``report`` (SPEC §4).

Imported by :mod:`mimesis_lab.config` (which owns :class:`Params` and re-exports these names);
kept apart so that module stays readable. Both build on :mod:`mimesis_lab.config_base`. Every
field has a help text; unknown keys are errors.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from mimesis_lab.config_base import AgentRolloutParams, JudgeParams, OpenAIEndpoint, Section
from mimesis_lab.envs.gyms.registry import ALL_GYMS

__all__ = ["EvalSimulatorParams", "EvalPartnerParams", "DiscriminatorParams", "SimEvalParams", "EvalUserParams",
           "AgentEvalParams", "ReportParams"]


def _check_source(p, path_kinds: tuple[str, ...]):
    """A model-backed section (``kind``, ``model_path``, ``openai``) names what its kind needs."""
    if p.kind in path_kinds and not p.model_path:
        raise ValueError(f"kind `{p.kind}` needs model_path")
    if p.kind == "openai" and p.openai is None:
        raise ValueError("kind `openai` needs an `openai` endpoint")
    return p


class EvalSimulatorParams(Section):
    """One simulator under evaluation (the trained one or a baseline)."""

    kind: Literal["checkpoint", "base", "prompted", "openai"] = Field(
        description="`checkpoint`: a trained simulator folder (`model_path`), prompted as in training; `base`: the "
        "un-trained base model (tiny profile: built from the `model` section with random weights; otherwise "
        "`model_path`); `prompted`: `model_path` with an explicit 'act as the user' instruction (the prompted "
        "baseline); `openai`: an OpenAI-compatible endpoint.")
    model_path: str | None = Field(None, description="Checkpoint folder for `checkpoint` / `prompted` (and `base` "
                                   "when the base is a real checkpoint).")
    openai: OpenAIEndpoint | None = Field(None, description="Endpoint for kind `openai`.")

    @model_validator(mode="after")
    def _needs(self) -> "EvalSimulatorParams":
        return _check_source(self, ("checkpoint", "prompted"))


class EvalPartnerParams(Section):
    """The fixed assistant the simulated user talks to in the fidelity benchmark."""

    kind: Literal["replay", "openai"] = Field(
        "replay", description="`replay`: the held-out conversation's own assistant turns, in order (offline, "
        "deterministic; the simulated user answers exactly what the real user answered); `openai`: an endpoint.")
    openai: OpenAIEndpoint = Field(default_factory=lambda: OpenAIEndpoint(model="assistant"),
                                   description="Endpoint for kind `openai`.")


class DiscriminatorParams(Section):
    """Who tells human from simulated conversations (Turing distance)."""

    kind: Literal["rule", "openai"] = Field(
        "rule", description="`rule`: a cross-validated classifier over transparent style features (offline); "
        "`openai`: an LLM judge answering `human` or `simulated`.")
    openai: OpenAIEndpoint = Field(default_factory=lambda: OpenAIEndpoint(model="judge"),
                                   description="Endpoint for kind `openai`.")


class SimEvalParams(Section):
    """Simulator benchmarks (SPEC §4.1) for every simulator in ``simulators``."""

    simulators: dict[str, EvalSimulatorParams] = Field(
        default_factory=lambda: {
            "mimesis": EvalSimulatorParams(kind="checkpoint", model_path="models/sim_rl/final"),
            "sft": EvalSimulatorParams(kind="checkpoint", model_path="models/sft/final"),
            "prompted": EvalSimulatorParams(kind="prompted", model_path="models/midtrain/final"),
            "base": EvalSimulatorParams(kind="base"),
        },
        description="Name -> simulator. The first one is the simulator under test; the others are baselines.")
    conversations: str = Field("data/splits/thoughttrace/test.parquet",
                               description="Held-out human conversations with user profiles (fidelity, tau-USI "
                               "statistics, Turing distance).")
    behavior_tasks: str = Field("data/splits/behavior_tasks/test.parquet",
                                description="Held-out behaviour scenarios (reward decomposition, ECE).")
    max_conversations: int | None = Field(None, gt=0, description="Use at most this many conversations (null: all).")
    max_behavior_tasks: int | None = Field(None, gt=0, description="Use at most this many behaviour tasks.")
    turn_budget: int = Field(4, gt=0, description="Simulated user turns per conversation.")
    max_new_tokens: int = Field(48, gt=0, description="Tokens per simulated user turn.")
    temperature: float = Field(1.0, ge=0, description="Simulator sampling temperature.")
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1,
                             description="Evaluation seeds: aggregates are mean ± standard error over them.")
    ece_bins: int = Field(3, gt=0, description="Difficulty bins of the ECE.")
    bootstrap: int = Field(1000, gt=0, description="Cluster-bootstrap resamples (over user ids) of the FI CI.")
    assistant: EvalPartnerParams = Field(default_factory=EvalPartnerParams, description="The fixed assistant.")
    judge: JudgeParams = Field(default_factory=JudgeParams, description="Fidelity and behaviour judge.")
    discriminator: DiscriminatorParams = Field(default_factory=DiscriminatorParams,
                                               description="Human-vs-simulated discriminator.")
    output_dir: str = Field("eval/sim_eval", description="Per-simulator records and summary JSON.")
    metrics: str = Field("metrics/sim_eval.json", description="DVC metrics file.")

    @field_validator("simulators")
    @classmethod
    def _some(cls, v):
        if not v:
            raise ValueError("sim_eval.simulators needs at least one simulator")
        return v


class EvalUserParams(Section):
    """One evaluation user of ``agent_eval``; it must differ from the training user."""

    kind: Literal["scripted", "simulator", "prompted", "openai"] = Field(
        description="`scripted`: a deterministic cooperative user that answers from the task's hidden spec; "
        "`simulator`: a simulator checkpoint (`model_path`) served in-process; `prompted`: `model_path` with an "
        "'act as the user' instruction; `openai`: an OpenAI-compatible endpoint. Every kind but `scripted` is "
        "reached through the privileged shim, as in training.")
    model_path: str | None = Field(None, description="Checkpoint for `simulator` / `prompted`.")
    openai: OpenAIEndpoint | None = Field(None, description="Endpoint for `openai`.")
    max_new_tokens: int = Field(32, ge=1, description="Tokens per user reply.")
    temperature: float = Field(0.0, ge=0, description="User sampling temperature.")
    timeout_s: float = Field(60.0, gt=0, description="Per-reply timeout (a timeout makes the cell invalid).")
    tasks_per_gym: int | None = Field(
        None, gt=0, description="At most this many tasks per gym for this user (the first of the gym's evaluated "
        "tasks, so every user's tasks are a prefix of the longest list); null: agent_eval.tasks_per_gym. A cheap "
        "user (`scripted`) can play every task while a model user plays a few.")

    @model_validator(mode="after")
    def _needs(self) -> "EvalUserParams":
        return _check_source(self, ("simulator", "prompted"))


class AgentEvalParams(Section):
    """Agents x gyms x evaluation users (SPEC §4.2)."""

    agents: dict[str, str] = Field(
        default_factory=lambda: {"base": "models/agent_sft/final", "grpo": "models/agent_grpo/final",
                                 "csd": "models/agent_csd/final"},
        description="Method name -> agent checkpoint folder.")
    users: dict[str, EvalUserParams] = Field(
        default_factory=lambda: {
            "scripted": EvalUserParams(kind="scripted"),
            "midtrain_sim": EvalUserParams(kind="simulator", model_path="models/midtrain/final"),
            "prompted": EvalUserParams(kind="prompted", model_path="models/midtrain/final"),
        },
        description="Evaluation user name -> user (at least 3 in the paper's protocol; none may be the training "
        "user).")
    training_user: str = Field("models/sim_rl/final", description="The training user's checkpoint (or base_url): "
                               "an evaluation user equal to it is an error.")
    data: list[str] = Field(default_factory=lambda: ["data/gyms/val.parquet", "data/gyms/test.parquet"],
                            description="UserRL rows to evaluate on (val rows of the training gyms, test rows of "
                            "the held-out gyms).")
    gyms: list[str] = Field(default_factory=lambda: list(ALL_GYMS), description="Gyms to evaluate.")
    tasks_per_gym: int | None = Field(None, gt=0, description="At most this many tasks per gym (null: all), the "
                                      "first in natural task-id order; a user's own tasks_per_gym overrides it.")
    pass_k: int = Field(1, ge=1, description="Attempts per task; a task passes when any attempt succeeds.")
    rollout: AgentRolloutParams = Field(
        default_factory=lambda: AgentRolloutParams(temperature=0.0, max_turns=16),
        description="Agent generation (temperature 0 in the paper).")
    output_dir: str = Field("eval/agent_eval", description="Results and summary JSON.")
    cache_dir: str = Field("eval/agent_eval_cache", description="One JSON per finished rollout; a rerun only runs "
                           "what is missing (kept across DVC runs: `persist`).")
    metrics: str = Field("metrics/agent_eval.json", description="DVC metrics file.")
    workers: int = Field(1, ge=1, description="Processes that play the missing rollouts, an (agent, user) pair at "
                         "a time (pairs spread by rollout count), each with 1/workers of this process's torch "
                         "threads: the same batches, rollouts and cache as in one process. 1 = in this process.")

    @field_validator("gyms")
    @classmethod
    def _known(cls, v):
        bad = [g for g in v if g not in ALL_GYMS]
        if bad or not v:
            raise ValueError(f"unknown gyms {bad}; known: {list(ALL_GYMS)}")
        return v

    @model_validator(mode="after")
    def _users_differ_from_training(self) -> "AgentEvalParams":
        if not self.agents or not self.users:
            raise ValueError("agent_eval needs at least one agent and one evaluation user")
        train = self.training_user.rstrip("/")
        for name, u in self.users.items():
            ident = (u.model_path or (u.openai.base_url if u.openai else "") or "").rstrip("/")
            if ident and ident == train:
                raise ValueError(f"agent_eval.users.{name} is the training user ({train}); evaluation users must "
                                 "differ from the training user")
        return self

    def user_tasks_per_gym(self, user: str) -> int | None:
        """Tasks per gym that evaluation user ``user`` plays (its own ``tasks_per_gym``, else the section's;
        None: all)."""
        own = self.users[user].tasks_per_gym
        return own if own is not None else self.tasks_per_gym

    def max_tasks_per_gym(self) -> int | None:
        """Tasks per gym selected for evaluation: the most any user plays (None: all)."""
        counts = [self.user_tasks_per_gym(u) for u in self.users] or [self.tasks_per_gym]
        return None if any(c is None for c in counts) else max(counts)


class ReportParams(Section):
    """The comparison report (paper Table 2 shape) and plots."""

    output: str = Field("reports/report.md", description="Markdown report.")
    plots_dir: str = Field("reports/plots", description="PNG plots (also MLflow artifacts).")
    metrics: str = Field("metrics/report.json", description="DVC metrics file of the headline numbers.")
