"""The base of every ``params.yaml`` section and the sub-sections that training and evaluation
sections both use: an OpenAI-compatible endpoint, a judge, the rollout settings.

:mod:`mimesis_lab.config` (training sections, :class:`~mimesis_lab.config.Params`) and
:mod:`mimesis_lab.config_eval` (evaluation sections) both import from here; every name is
re-exported by :mod:`mimesis_lab.config`.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ConfigError", "Section", "OpenAIEndpoint", "JudgeParams", "RolloutParams", "AgentRolloutParams"]


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
    max_turns: int = Field(4, ge=1, description="Agent turns per episode (the paper: 16).")
    max_total_tokens: int = Field(2048, gt=16, description="Prompt + all turns; beyond it the episode is invalid "
                                  "`context_overflow`.")
    step_timeout_s: float = Field(120.0, gt=0, description="A gym step (incl. the user's reply) slower than this "
                                  "is invalid `timeout`.")
    show_reward: bool = Field(True, description="Append `Reward: r` to the tool feedback (as the reference).")
