"""``WorldParams``: the sizes and knobs of the synthetic world (strict, unknown keys rejected)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["WorldParams", "CHAT_SOURCES", "TT_DOMAINS"]

#: chat source (file stem under chats/) -> what it holds; ``tom_social`` is the no-swap source
CHAT_SOURCES = ("wildchat_travel", "wildchat_shopping", "wildchat_games", "tom_social")
#: ThoughtTrace domains
TT_DOMAINS = ("support", "travel", "retail", "telepathy", "turtle", "persuade", "intention")


class WorldParams(BaseModel):
    """Sizes default to what the tiny CPU pipeline digests in minutes (~50k target tokens of chats in the train split)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    seed: int = Field(1234, description="Seed of everything: same seed, byte-identical files.")
    users: int = Field(150, ge=8, le=5000, description="Users in the population (every dataset draws from them).")
    chats_per_user: int = Field(12, ge=1, description="WildChat-style chats per user (mid-training corpus).")
    chat_mix: dict[str, float] = Field(
        default_factory=lambda: {"wildchat_travel": 3.0, "wildchat_shopping": 2.0, "wildchat_games": 2.0,
                                 "tom_social": 1.0},
        description=f"Relative share of each chat source (file chats/<source>.jsonl); sources: {', '.join(CHAT_SOURCES)}. "
        "tom_social is theory-of-mind talk whose assistant turns explain a user's unstated reasons (a no-swap source).")
    thoughttrace_conversations: int = Field(400, ge=1, description="ThoughtTrace conversations (reasoning SFT).")
    thoughttrace_mix: dict[str, float] = Field(
        default_factory=lambda: {"support": 0.35, "travel": 0.25, "retail": 0.05, "telepathy": 0.07,
                                 "turtle": 0.07, "persuade": 0.11, "intention": 0.10},
        description=f"Relative share of each ThoughtTrace domain; domains: {', '.join(TT_DOMAINS)}. `support` "
        "conversations are ABCD customer chats conditioned on a behaviour (or neutral) through the expectation.")
    neutral_share: float = Field(1 / 3, ge=0, le=1, description="Share of behaviour-conditioned ThoughtTrace support "
                                 "conversations that are neutral (N).")
    enact_rate: float = Field(0.6, ge=0, le=1, description="Probability that a behaviour-conditioned conversation "
                              "enacts its behaviour (the rest stay cooperative), so simulator RL sees reward variance.")
    behavior_turn_budget: int = Field(5, ge=3, le=8, description="Turn budget the behaviour kwargs of ThoughtTrace "
                                      "support conversations are built for (when to add, switch, leave).")
    min_user_turns: int = Field(2, ge=1, description="Fewest user turns of a conversation.")
    max_user_turns: int = Field(6, ge=2, description="Most user turns of a conversation.")
    abcd_scenarios: int = Field(100, ge=3, description="ABCD conversations (scenario + the customer's chat with the "
                                "scripted agent), split train/dev/test.")
    abcd_dev_fraction: float = Field(0.1, ge=0, lt=0.5, description="Share of ABCD conversations in `dev`.")
    abcd_test_fraction: float = Field(0.1, ge=0, lt=0.5, description="Share of ABCD conversations in `test`.")
    gym_tasks: int = Field(30, ge=1, description="Tasks per gym (each of the eight task files).")

    @field_validator("chat_mix")
    @classmethod
    def _chat_sources(cls, v: dict[str, float]) -> dict[str, float]:
        bad = sorted(set(v) - set(CHAT_SOURCES))
        if bad or not v or any(w < 0 for w in v.values()) or not sum(v.values()) > 0:
            raise ValueError(f"chat_mix: sources must be among {list(CHAT_SOURCES)} with non-negative weights "
                             f"(not all 0), got {v}")
        return v

    @field_validator("thoughttrace_mix")
    @classmethod
    def _tt_domains(cls, v: dict[str, float]) -> dict[str, float]:
        bad = sorted(set(v) - set(TT_DOMAINS))
        if bad or not v or any(w < 0 for w in v.values()) or not sum(v.values()) > 0:
            raise ValueError(f"thoughttrace_mix: domains must be among {list(TT_DOMAINS)} with non-negative weights "
                             f"(not all 0), got {v}")
        return v

    @model_validator(mode="after")
    def _turns(self) -> "WorldParams":
        if self.min_user_turns > self.max_user_turns:
            raise ValueError(f"min_user_turns {self.min_user_turns} > max_user_turns {self.max_user_turns}")
        return self
