"""Templated-but-varied grammar and each user's persistent writing style.

:func:`expand` turns a template into text: ``(a|b|c)`` picks one alternative, ``[x]`` is an
optional part kept with a probability that grows with the user's verbosity. Alternatives nest.
:func:`say` then applies the user's style: greeting on the first turn, politeness markers,
abbreviations (pls / thx / u), end punctuation and casing. Reasons (the private ``<think>``
text) are plain lower-case and never styled.
"""
from __future__ import annotations

import random
import re

from mimesis_lab.world.population import User

__all__ = ["expand", "say", "plain", "Turn", "Dialogue"]

_KEEP = {0: 0.15, 1: 0.5, 2: 0.9}


def _split_alts(body: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in body:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "|" and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out


def _match(t: str, i: int) -> int:
    depth = 0
    for j in range(i, len(t)):
        if t[j] in "([":
            depth += 1
        elif t[j] in ")]":
            depth -= 1
            if depth == 0:
                return j
    raise ValueError(f"unbalanced template: {t!r}")


def expand(template: str, rng: random.Random, verbosity: int = 1) -> str:
    """``(a|b)`` → one of them, ``[x]`` → x or nothing; then whitespace is collapsed."""
    out, i = "", 0
    while i < len(template):
        ch = template[i]
        if ch in "([":
            j = _match(template, i)
            body = template[i + 1:j]
            if ch == "(":
                out += expand(rng.choice(_split_alts(body)), rng, verbosity)
            elif rng.random() < _KEEP[verbosity]:
                out += expand(body, rng, verbosity)
            i = j + 1
        else:
            out += ch
            i += 1
    out = re.sub(r"\s+", " ", out).strip()
    return re.sub(r"\s+([,.?!])", r"\1", out)


def plain(template: str, rng: random.Random) -> str:
    """A reason or an assistant line: expanded at normal verbosity, no user style."""
    return expand(template, rng, 1)


_ABBREV = ((r"\bplease\b", "pls"), (r"\bthanks\b", "thx"), (r"\byou\b", "u"), (r"\byour\b", "ur"))
_COURTESY = re.compile(r"\b(thanks|thank you|thx|great|perfect|hi|hello|hey|bye|awesome)\b")


def say(u: User, template: str, rng: random.Random, kind: str = "answer", first: bool = False,
        slots: dict[str, str] | None = None) -> str:
    """What user ``u`` types for ``template``. ``kind``: ``request``, ``answer``, ``question`` get
    politeness markers; ``complaint``, ``raw`` do not (``raw`` keeps casing and punctuation too).
    ``slots`` fill ``{name}`` placeholders after expansion (values with brackets, e.g. phone numbers)."""
    text = expand(template, rng, u.verbosity)
    fill = (lambda x: x.format(**slots)) if slots else (lambda x: x)  # noqa: E731 - values keep their case
    if kind == "raw":
        return fill(text)
    body = text.rstrip(" .!")
    q = body.endswith("?")
    body = body.rstrip("?")
    courteous = re.search(r"\b(please|thanks|thank you)\b", body) is not None
    if u.polite and courteous:
        pass
    elif u.polite and kind in ("request", "question"):
        body = f"{body} please" if u.polite == 1 else f"please {body}, thank you"
    elif u.polite and kind == "answer" and rng.random() < 0.6:
        body = f"{body} thanks" if u.polite == 1 else f"{body}, thank you"
    if first and u.greeting:
        body = f"{u.greeting}, {body}"
    if u.abbrev:
        for rx, rep in _ABBREV:
            body = re.sub(rx, rep, body)
    end = "?" if q else u.punct
    if end == "." and _COURTESY.search(body) and rng.random() < 0.5:
        end = "!"
    text = body + end
    if u.casing == "lower":
        return fill(text.lower())
    text = re.sub(r"\bi\b", "I", text)
    text = re.sub(r"\bi'(m|ll|d|ve)\b", lambda m: "I'" + m.group(1), text)
    return fill(text[:1].upper() + text[1:])


class Turn:
    """One message: ``role`` user|assistant, ``content``; user turns carry ``reason`` (private),
    assistant turns the user's ``reaction`` to them (ThoughtTrace ``reactions``)."""

    __slots__ = ("role", "content", "reason", "reaction")

    def __init__(self, role: str, content: str, reason: str = "", reaction: str = ""):
        self.role, self.content, self.reason, self.reaction = role, content, reason, reaction

    def __repr__(self) -> str:
        extra = f" <{self.reason}>" if self.reason else ""
        return f"{self.role}: {self.content}{extra}"


class Dialogue:
    """A conversation of one user in one domain, plus what only the user knows.

    ``summary``/``expectation`` become the ThoughtTrace task summary/expectation (the simulator's
    system prompt); ``hidden`` lists the private facts (preference values, the entity, the
    withheld field…) so the withholding rate can be measured; ``meta`` holds the rest (behaviour,
    kwargs, whether it was enacted, the options…).
    """

    def __init__(self, user: User, domain: str, summary: str, expectation: str):
        self.user, self.domain, self.summary, self.expectation = user, domain, summary, expectation
        self.turns: list[Turn] = []
        #: the partner's messages before the user's first turn (a support agent's greeting), in the
        #: ThoughtTrace record only: a WildChat conversation opens with the user
        self.opening: list[str] = []
        self.hidden: list[str] = []
        self.meta: dict = {}

    def u(self, content: str, reason: str) -> None:
        self.turns.append(Turn("user", content, reason))

    def a(self, content: str, reaction: str = "") -> None:
        self.turns.append(Turn("assistant", content, "", reaction))

    @property
    def n_user(self) -> int:
        return sum(t.role == "user" for t in self.turns)
