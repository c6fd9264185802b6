"""Per-conversation user statistics for the tau-USI behaviour dimensions D1–D4 (SPEC §4.1).

Pure functions over one conversation's turns (``[{"role": "user"|"assistant", "content"}]``, the
human — real or simulated — in the ``user`` role); no I/O. Every statistic is non-negative (the
Dice similarity :func:`mimesis_lab.evals.metrics.dice` needs that) and ``None`` when it is
undefined for the conversation (e.g. a reaction rate without any assistant turn before a user
turn); undefined values are skipped in means, never read as 0.

Features (``U`` = user turns, ``A`` = user turns that directly follow an assistant turn):

=====  ==========================  =================================================================
dim    feature                     definition
=====  ==========================  =================================================================
D1     ``words_per_turn``          mean word count over ``U``
D1     ``politeness_rate``         share of ``U`` with a politeness marker (:data:`POLITE_RX`)
D1     ``exclamation_rate``        share of ``U`` containing ``!``
D1     ``question_rate``           share of ``U`` containing ``?``
D2     ``disclosure_share``        share of the task facts (:func:`task_facts`) stated in any of ``U``
D2     ``disclosure_position``     mean over stated facts of ``(k + 1) / |U|``, ``k`` the 0-based
                                   index of the first user turn stating the fact (``None`` if no
                                   fact is stated): 1/|U| = everything up front, 1 = only at the end
D3     ``clarification_rate``      share of ``A`` with a clarification request (:data:`CLARIFY_RX`)
D3     ``followup_question_rate``  share of ``A`` containing ``?``
D4     ``correction_rate``         share of ``A`` correcting the assistant (:data:`CORRECTION_RX`)
D4     ``complaint_rate``          share of ``A`` complaining / showing annoyance (:data:`COMPLAINT_RX`)
=====  ==========================  =================================================================

D4 is the user's *reaction to agent errors*: in the fidelity benchmark the assistant side is the
same for the human and the simulated user (replayed), so a human correction marks an assistant
error, and the simulator matches when it reacts at a similar rate.

A "fact" is a content-word stem of the task description (``Task:`` and ``Expectations:`` lines of a
ThoughtTrace system prompt): stop words removed, a plural ``s`` stripped; a fact is *stated* when
its stem occurs among the stems of the user turn.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

from mimesis_lab.envs.usersim_tasks import content_words, parse_system_prompt, words

__all__ = [
    "POLITE_RX", "CLARIFY_RX", "CORRECTION_RX", "COMPLAINT_RX", "DIMENSION_FEATURES", "FEATURES",
    "stem", "stems", "task_facts", "first_disclosure", "user_turns", "reaction_turns", "conversation_stats",
    "mean_stats", "usi_dimensions",
]

POLITE_RX = re.compile(r"\b(please|pls|plz|thanks|thank you|thank u|thx|ty|sorry|appreciate[d]?|kindly|cheers)\b")
CLARIFY_RX = re.compile(
    r"\b(what do you mean|what does .{1,40} mean|what is meant|(can|could|would) you (explain|clarify|elaborate)|"
    r"clarify|i don'?t (understand|get (it|what))|not sure what you mean|do you mean|did you mean|meaning of|"
    r"which one|what exactly)\b")
CORRECTION_RX = re.compile(
    r"(^\s*no\b|\b(wrong|incorrect|not correct|not right|mistake|you missed|you forgot|you left out|left out|"
    r"that'?s not|that is not|not what i|i said|i asked|should be|instead of|count again|try again|"
    r"doesn'?t work|didn'?t work|not working|still (wrong|not|missing|has))\b)")
COMPLAINT_RX = re.compile(
    r"\b(obviously|seriously|ugh|come on|annoying|annoyed|frustrat\w*|useless|ridiculous|why (did|would) you|"
    r"already (told|said)|i told you|again\?)")

DIMENSION_FEATURES: dict[str, tuple[str, ...]] = {
    "d1": ("words_per_turn", "politeness_rate", "exclamation_rate", "question_rate"),
    "d2": ("disclosure_share", "disclosure_position"),
    "d3": ("clarification_rate", "followup_question_rate"),
    "d4": ("correction_rate", "complaint_rate"),
}
FEATURES: tuple[str, ...] = tuple(f for fs in DIMENSION_FEATURES.values() for f in fs)


def _norm(text: Any) -> str:
    return str(text or "").lower().replace("\u2019", "'").replace("\u2018", "'")


def stem(w: str) -> str:
    """A plural ``s`` stripped from words longer than 3 letters (``ss`` kept)."""
    return w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w


def stems(text: Any) -> set[str]:
    """Distinct stems of the content words of ``text``."""
    return {stem(w) for w in content_words(text)}


def task_facts(system_prompt: str) -> list[str]:
    """The task facts of a ThoughtTrace system prompt: content stems of ``Task:`` + ``Expectations:``, in order."""
    info = parse_system_prompt(system_prompt)
    out: list[str] = []
    for w in content_words(f"{info['task']} {info['expectations']}"):
        s = stem(w)
        if s not in out:
            out.append(s)
    return out


def first_disclosure(turns: Sequence[str], facts: Iterable[str]) -> dict[str, int | None]:
    """Fact → 0-based index of the first of ``turns`` stating it (``None``: never stated)."""
    per_turn = [stems(t) for t in turns]
    return {f: next((k for k, s in enumerate(per_turn) if f in s), None) for f in facts}


def user_turns(conversation: Sequence[Mapping[str, Any]]) -> list[str]:
    """The contents of the ``user`` turns, in order."""
    return [str(t.get("content") or "") for t in conversation if t.get("role") == "user"]


def reaction_turns(conversation: Sequence[Mapping[str, Any]]) -> list[str]:
    """The user turns that directly follow an assistant turn (the user's reactions to it)."""
    out = []
    for prev, t in zip(conversation, conversation[1:]):
        if t.get("role") == "user" and prev.get("role") == "assistant":
            out.append(str(t.get("content") or ""))
    return out


def _rate(turns: Sequence[str], pred) -> float | None:
    return sum(1 for t in turns if pred(t)) / len(turns) if turns else None


def conversation_stats(conversation: Sequence[Mapping[str, Any]], facts: Sequence[str] = ()
                       ) -> dict[str, float | None]:
    """All :data:`FEATURES` of one conversation (see the module docstring); ``None`` = undefined."""
    us = user_turns(conversation)
    rs = reaction_turns(conversation)
    out: dict[str, float | None] = {
        "words_per_turn": sum(len(words(t)) for t in us) / len(us) if us else None,
        "politeness_rate": _rate(us, lambda t: bool(POLITE_RX.search(_norm(t)))),
        "exclamation_rate": _rate(us, lambda t: "!" in t),
        "question_rate": _rate(us, lambda t: "?" in t),
        "clarification_rate": _rate(rs, lambda t: bool(CLARIFY_RX.search(_norm(t)))),
        "followup_question_rate": _rate(rs, lambda t: "?" in t),
        "correction_rate": _rate(rs, lambda t: bool(CORRECTION_RX.search(_norm(t)))),
        "complaint_rate": _rate(rs, lambda t: bool(COMPLAINT_RX.search(_norm(t)))),
        "disclosure_share": None,
        "disclosure_position": None,
    }
    facts = list(dict.fromkeys(facts))
    if facts and us:
        first = first_disclosure(us, facts)
        stated = [k for k in first.values() if k is not None]
        out["disclosure_share"] = len(stated) / len(facts)
        out["disclosure_position"] = (sum((k + 1) / len(us) for k in stated) / len(stated)) if stated else None
    return out


def mean_stats(stats: Sequence[Mapping[str, float | None]]) -> dict[str, float | None]:
    """Per feature, the mean over conversations where it is defined (``None`` if it never is)."""
    out: dict[str, float | None] = {}
    for f in FEATURES:
        vals = [float(s[f]) for s in stats if s.get(f) is not None]
        out[f] = sum(vals) / len(vals) if vals else None
    return out


def usi_dimensions(sim_stats: Sequence[Mapping[str, float | None]], human_stats: Sequence[Mapping[str, float | None]]
                   ) -> tuple[dict[str, float | None], dict[str, list[str]]]:
    r"""D1–D4 in percent: per dimension ``D = mean_{m} Dice(M_m, H_m)`` over its features (eq. 15).

    ``M_m`` / ``H_m`` are the means of feature ``m`` over the simulated / human conversations
    (:func:`mean_stats`). A feature undefined on either side is left out of its dimension (listed in
    the second return value, ``{dim: [dropped features]}``); a dimension with no feature left is
    ``None``.
    """
    from mimesis_lab.evals.metrics import dice_mean

    sim_m, hum_m = mean_stats(sim_stats), mean_stats(human_stats)
    dims: dict[str, float | None] = {}
    dropped: dict[str, list[str]] = {}
    for d, feats in DIMENSION_FEATURES.items():
        used = [f for f in feats if sim_m[f] is not None and hum_m[f] is not None]
        dropped[d] = [f for f in feats if f not in used]
        dims[d] = dice_mean({f: sim_m[f] for f in used}, {f: hum_m[f] for f in used}) if used else None
    return dims, dropped
