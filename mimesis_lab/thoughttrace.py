"""ThoughtTrace formatting for reasoning + utterance SFT (SPEC §2.2).

Each human message becomes the simulator's target ``<think>{reasons}</think>{utterance}``
in the ``assistant`` slot; the AI replies become ``user`` turns; the system prompt is
built from the task summary, the expectations and the survey profile. With
``include_reactions`` (default off, as in the paper) the user's reaction to the
previous AI reply is put into the think block before the reasons.

These are the per-record reference functions; ``stages/thoughttrace.py`` runs the same
transform vectorised in polars, and a test checks the two agree.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

SYSTEM_HEADER = (
    "You are a real human user talking to an AI assistant. Write the user's next message. "
    "Before each message, think about why you are sending it inside <think></think>, "
    "then write only what the user would type."
)
PROFILE_FIELDS = ("age", "gender", "education", "occupation", "frequency", "purposes")
REACTION_PREFIX = "Reaction to the last reply: "


def _clean(text: Any) -> str | None:
    if text is None:
        return None
    if isinstance(text, (list, tuple)):
        text = ", ".join(str(t).strip() for t in text if str(t).strip())
    text = str(text).strip()
    return text or None


def profile_text(survey: Mapping[str, Any] | None) -> str | None:
    """``age: 25-34; gender: Female; …`` from one survey answer (None if empty)."""
    if not survey:
        return None
    parts = [f"{k}: {v}" for k in PROFILE_FIELDS if (v := _clean(survey.get(k))) is not None]
    return "; ".join(parts) or None


def build_system_prompt(task_summary: str | None, task_expectation: str | None,
                        survey: Mapping[str, Any] | None) -> str:
    """System prompt from the task summary, the expectations and the survey profile."""
    lines = [SYSTEM_HEADER]
    for label, value in (("Task", _clean(task_summary)), ("Expectations", _clean(task_expectation)),
                         ("User profile", profile_text(survey))):
        if value is not None:
            lines.append(f"{label}: {value}")
    return "\n".join(lines)


def simulator_system_prompt(instructions: str, expectation: str | None = None) -> str:
    """A task's user instructions in the layout the simulator was trained on (:func:`build_system_prompt`:
    :data:`SYSTEM_HEADER`, then ``Task:`` and ``Expectations:``), so that a gym's or a behaviour task's user
    prompt reaches the simulator as the ThoughtTrace SFT prompts did. A prompt already in that layout is kept."""
    text = str(instructions or "").strip()
    if text.startswith(SYSTEM_HEADER):
        return text
    return build_system_prompt(text or None, expectation, None)


def think_block(reasons: Sequence[str], reactions: Sequence[str] = ()) -> str:
    """``<think>`` content: reaction lines (if any) then reasons, one per line."""
    lines = [REACTION_PREFIX + r for r in reactions] + list(reasons)
    return "\n".join(lines)


def is_alternating(types: Sequence[str]) -> tuple[bool, str | None]:
    """Strict alternation with at least one user message; returns (ok, reason). The AI may open (a support
    agent's greeting: it becomes the first user-role message, the context of the first target, as the
    behaviour task's replayed opening is in simulator RL)."""
    if not types:
        return False, "empty conversation"
    for i in range(1, len(types)):
        if types[i] == types[i - 1]:
            return False, f"messages {i - 1} and {i} are both {types[i]!r}"
    if "user" not in types:
        return False, "no user message (an AI opening alone has no target)"
    return True, None


def _texts(items: Sequence[Mapping[str, Any]] | None) -> list[str]:
    return [c for it in (items or []) if (c := _clean(it.get("content"))) is not None]


def format_conversation(record: Mapping[str, Any], include_reactions: bool = False) -> list[dict[str, str]]:
    """Chat messages for one (alternating) ThoughtTrace record."""
    survey = (record.get("survey_answers") or [None])[0]
    out = [{"role": "system", "content": build_system_prompt(
        record.get("task_summary"), record.get("task_expectation"), survey)}]
    prev_reactions: list[str] = []
    for msg in record["messages"]:
        if msg["type"] == "user":
            think = think_block(_texts(msg.get("reasons")), prev_reactions if include_reactions else ())
            out.append({"role": "assistant", "content": f"<think>{think}</think>{msg['content']}"})
        else:
            out.append({"role": "user", "content": msg["content"]})
            prev_reactions = _texts(msg.get("reactions"))
    return out
