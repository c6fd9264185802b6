"""The base of every ``params.yaml`` section and the sub-sections that training and evaluation
sections both use: an OpenAI-compatible endpoint, a judge, the rollout settings; and
:class:`Schema`, what the group merge (:mod:`mimesis_lab.config_groups`) and the generated help
(:mod:`mimesis_lab.config_help`) know of the params file.

:mod:`mimesis_lab.config` (training sections, :class:`~mimesis_lab.config.Params`) and
:mod:`mimesis_lab.config_eval` (evaluation sections) both import from here; every name is
re-exported by :mod:`mimesis_lab.config`.
"""
from __future__ import annotations

from types import UnionType
from typing import Any, Literal, Mapping, NamedTuple, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ConfigError", "Section", "OpenAIEndpoint", "JudgeParams", "RolloutParams", "AgentRolloutParams",
           "SharedGroup", "Schema", "section_model"]


class ConfigError(ValueError):
    """A params file that does not validate; the message names file and key."""


class Section(BaseModel):
    """Base of every section: strict types, unknown keys rejected, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class OpenAIEndpoint(Section):
    base_url: str = Field("http://127.0.0.1:8000/v1", description="OpenAI-compatible base URL (…/v1).")
    model: str = Field("annotator", description="Model name sent in the request.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Environment variable holding the API key (may be unset).")
    timeout_s: float = Field(60.0, gt=0, description="Per-request timeout in seconds.")
    max_retries: int = Field(2, ge=0, description="Retries after a failed or schema-invalid answer.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature.")


class JudgeParams(Section):
    kind: Literal["rule", "openai"] = Field("rule", description="`rule`: deterministic offline judge; "
                                            "`openai`: LLM judge with strict JSON verdicts.")
    openai: OpenAIEndpoint = Field(default_factory=lambda: OpenAIEndpoint(model="judge"),
                                   description="Endpoint of the `openai` judge.")


class RolloutParams(Section):
    backend: Literal["transformers", "vllm"] = Field(
        "transformers", description="Generation backend of the policy (vllm: GPU only, refreshed every step).")
    batch_size: int = Field(16, ge=1, description="Prompts per generation call (transformers backend).")
    max_new_tokens: int = Field(64, ge=1, description="Tokens generated per simulator turn.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature (log-probs are always at T=1).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    max_prompt_tokens: int = Field(1536, gt=8, description="A longer simulator prompt ends the episode as "
                                   "invalid `context_overflow`.")
    gpu_memory_utilization: float = Field(0.4, gt=0, lt=1, description="vLLM only.")
    prefix_cache_tokens: int = Field(65536, ge=0, description="transformers backend: KV of finished turns kept "
                                     "(tokens) and reused by the episode's next prompt within a step; 0 = off.")


class AgentRolloutParams(RolloutParams):
    """The agent's generation in the gyms (the simulator's settings, with these read per agent turn)."""

    max_new_tokens: int = Field(64, ge=1, description="Tokens generated per agent turn.")
    max_prompt_tokens: int = Field(1536, gt=8, description="Not read by the agent rollout, which bounds the "
                                   "prompt and all turns together by max_total_tokens.")
    max_turns: int = Field(4, ge=1, description="Agent turns per episode (the paper: 16).")
    max_total_tokens: int = Field(2048, gt=16, description="Prompt + all turns; beyond it the episode is invalid "
                                  "`context_overflow`.")
    step_timeout_s: float = Field(120.0, gt=0, description="A gym step (incl. the user's reply) slower than this "
                                  "is invalid `timeout`.")
    show_reward: bool = Field(True, description="Append `Reward: r` to the tool feedback (as the reference).")


class SharedGroup(NamedTuple):
    """A ``params.yaml`` section written once and shared by several phase sections (as litgpt reuses
    ``train: TrainArgs`` in every fine-tuning method)."""

    members: tuple[str, ...]
    description: str


class Schema(NamedTuple):
    """The root model of a params file, its shared groups, and the keys a group must not hold."""

    root: type[BaseModel]
    groups: Mapping[str, SharedGroup]
    per_phase_keys: tuple[str, ...] = ()

    def section(self, name: str) -> type[BaseModel] | None:
        """The model of a top-level section (by name or alias); a shared group's is its first member's."""
        name = self.groups[name].members[0] if name in self.groups else name
        f = next((f for n, f in self.root.model_fields.items() if name in (n, f.alias)), None)
        return section_model(f.annotation) if f is not None else None


def section_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field's annotation holds (``X`` or ``X | None``), else None."""
    if isinstance(annotation, type):
        return annotation if issubclass(annotation, BaseModel) else None
    if get_origin(annotation) in (Union, UnionType):
        found = [m for m in map(section_model, get_args(annotation)) if m is not None]
        return found[0] if len(found) == 1 else None
    return None
