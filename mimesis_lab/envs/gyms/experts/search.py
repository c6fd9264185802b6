"""SearchGym expert: search the question, read the passages, answer with the span that fits it.

No user is needed (the SearchGym user knows only the question). The expert ``search``es the
question and reads the best-ranked passage whose title the question names, else the best-ranked
one (the next one when it yields nothing) with
:func:`extract_answer`: for "when / which year", the year of the sentence sharing most words with
the question; for "how much / what does it cost", the amount of money in that sentence; for a
question that ends on its preposition ("which city is the X hotel in?"), what follows that
preposition in the sentence closest to the question; otherwise a capitalised name (a lower-case last word when there is none) that does not
repeat a name of the question, scored by how close the question's words are — those just before it
count most ("built by X", "the emperor X") — and, for "who", a multi-word name after "by" first.
It is a reading heuristic, not an oracle: it can pick the wrong span, and the trace is then dropped.

Exploring, it first searches a keyword-only form of the question (a second search costs a turn).
"""
from __future__ import annotations

import re
from typing import Generator

from mimesis_lab.envs.gyms.experts.base import Action, Expert
from mimesis_lab.envs.gyms.text import sentences, words

__all__ = ["SearchExpert", "extract_answer"]

_UPPER = r"[^\W\d_a-z]"   # an upper-case letter (any script)
_WORD = rf"{_UPPER}[\w'’.-]*"
_NAME = re.compile(rf"{_WORD}(?:\s+(?:of|de|da|del|van|von|la|le)\s+{_WORD}|\s+{_WORD})*")
_LEAD = frozenset("the it its in he she they this a an on at his her their".split())


def extract_answer(question: str, passages: str) -> str | None:
    """The answer span of ``passages`` (a search observation) for ``question`` (module docstring)."""
    qw = words(question)
    proper = {re.sub(r"['’]s$", "", w.lower()) for w in re.findall(rf"{_UPPER}[\w'’]*", question)[1:]}  # its names
    blocks = [b for b in re.split(r"\n\s*\n", passages) if b.strip()]
    # a passage whose title the question names ("the royal rooms hotel" → "royal rooms") is read first
    blocks.sort(key=lambda b: not _titled(b, qw))
    for block in blocks:
        texts = [s for s in sentences(block) if not re.fullmatch(r"\[\d+\].*", s)]
        if texts:
            answer = _best_span(question, qw, proper, texts)
            if answer:
                return answer
    return None


_MONEY = re.compile(r"[$€£]\s?\d[\d,]*(?:\.\d+)?|\b\d[\d,]*(?:\.\d+)? (?:dollars|euros|pounds)\b", re.IGNORECASE)
_STRANDED = re.compile(r"\b(in|at|on|from|by|near|of|with)\s*\?\s*$", re.IGNORECASE)


def _titled(block: str, qw: set[str]) -> bool:
    m = re.match(r"\s*\[\d+\]\s*([^\n]+)\n", block)
    tw = words(m.group(1)) if m else set()
    return bool(tw) and tw <= qw


def _best_span(question: str, qw: set[str], proper: set[str], texts: list[str]) -> str | None:
    by_overlap = sorted(texts, key=lambda s: -len(words(s) & qw))
    if re.search(r"^\s*when\b|\b(which|what) year\b", question, re.IGNORECASE):
        years = [(len(words(s) & qw), y) for s in texts for y in re.findall(r"\b(1\d{3}|20\d{2})\b", s) if y not in qw]
        if years:
            return max(years, key=lambda t: t[0])[1]
    if re.search(r"\bhow much\b|\b(cost|costs|price|fee|charge)\b", question, re.IGNORECASE):
        for s in by_overlap:                # an amount of money, in the sentence closest to the question
            m = _MONEY.search(s)
            if m:
                return m.group(0).replace(" ", "")
    stranded = _STRANDED.search(question)
    if stranded:   # "which city is the X hotel in?": what follows "in" where the passage speaks of X
        for s in by_overlap:
            for m in re.finditer(rf"\b{stranded.group(1).lower()}\s+([^,.;:!?()]+)", s, re.IGNORECASE):
                toks = [t for t in m.group(1).split() if t.lower() not in _LEAD]
                if toks and not (words(" ".join(toks)) and words(" ".join(toks)) <= qw):
                    return " ".join(toks)
    who = bool(re.match(r"\s*who\b", question, re.IGNORECASE))
    cands: list[tuple[float, str]] = []
    for s in texts:
        toks = [t.lower() for t in re.findall(r"[\w'’]+", s)]
        hits = [i for i, t in enumerate(toks) if words(t) & qw]
        for m in _NAME.finditer(s):
            span = m.group(0).rstrip(".")
            if span.split()[0].lower() in _LEAD:
                span = " ".join(span.split()[1:])
            sw = {t.lower() for t in re.findall(r"[\w'’]+", span)}
            if not span or sw & proper or (words(span) and words(span) <= qw):
                continue
            at = len(re.findall(r"[\w'’]+", s[:m.start()])) + (len(m.group(0).split()) - len(span.split()))
            end = at + len(span.split()) - 1
            # question words just before the span count most ("built by X", "the emperor X")
            near = sum(1.0 / (at - i) if i < at else 0.5 / (i - end) if i > end else 1.0 for i in hits)
            person = who and (len(span.split()) > 1) + ("by" in toks[max(0, at - 3):at])
            cands.append((near + person, span))
    if cands:
        return max(cands, key=lambda c: c[0])[1]
    best = max(texts, key=lambda s: len(words(s) & qw))
    rest = [t for t in re.findall(r"[\w'’]+", best) if words(t) and not words(t) <= qw]
    return rest[-1] if rest else None


class SearchExpert(Expert):
    gym = "search"

    def policy(self) -> Generator[Action, str, None]:
        question = self.view.request.split("\n")[0].removeprefix("The user's question:").strip()
        if self.coin(0.6):
            yield ("search", " ".join(sorted(words(question))))
        obs = yield ("search", question)
        answer = extract_answer(question, obs)
        if answer:
            yield ("answer", answer)
