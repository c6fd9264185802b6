"""Leak validator for CSD coaching notes (SPEC §3.3.3; the reference has **none**).

A coaching note ``h_t`` is written with privileged information (the simulator's private
reasoning, the user's next utterance). The prompt forbids revealing private facts, but that is
a natural-language constraint only; here a note is checked against the episode's **private
facts** — strings taken from the gym's hidden task spec — and dropped when it reveals one.

**Facts per gym** (:func:`private_facts`; the public part of each task — the opening request,
the surface story, the category, the question, the claim — is never private):

* ``travel`` — for every *hidden* preference (``stated`` false): its text, its keywords that are
  not generic category words (``beach``, ``pet``, ``$150``, ``cheap``… but not ``budget``), the
  numbers and tag of its ``check`` (thresholds ``max``/``min``/``equals``, ``tag``); the best
  option's id and name. Keywords already in the public request are dropped.
* ``turtle`` — the solution, the key facts, and the solution's *distinctive* content words: those
  whose light stem is not in the surface story and that are not generic words.
* ``function`` — the hidden rule (matched as a compact expression) and the expected result.
* ``tau`` — the gold actions' goal details (:meth:`TauGym.hidden_facts`: cancel reason, new
  address, returned items, exchange targets), the task's ``outputs``, and the customer's
  identity from the hidden instruction: ``user_id``, e-mail addresses, order ids (``#W1002``)
  and the name after "You are" (the customer gives them; a coach must not).
* ``persuade`` — the hidden reasons for the user's stance and the user's persona.
* ``intention`` — every option of every missing detail (the episode's pick is drawn at reset,
  so all options are private), except ``no particular preference``; the task's ``chosen`` list
  when given instead. The numbers inside options (``$300-$800``) are facts on their own.
* ``telepathy`` — the entity, its aliases and their content words not in the public category.
* ``search`` — the answer, its aliases and their content words not in the public question.

*Core* facts (answers, entity names, the best option's id/name, the rule and result, tau ids)
are kept unless trivial, however short (the search answer ``Au``). Other ultra-generic facts are
dropped: a single word that is a stop word, has ≤ 2 letters or is in
:data:`GENERIC_WORDS` (``budget``, ``location``, ``preferences``…) is not a fact, so ``"ask
about their preferences"`` is never a leak; a phrase of ≥ 2 content words is kept even when its
words are common (``no longer needed``). Numbers and ids with digits are always content.

**Matching** (:func:`find_leaks`): case-insensitive, accents folded, on word tokens:

* a fact leaks when its token sequence (leading/trailing stop words stripped) occurs
  contiguously in the note, each token equal up to a plural ``-s``/``-es``;
* numbers are compared as numbers (``$150``, ``150`` and ``150.0`` all normalise to ``150``;
  ``1,000`` to ``1000``), never with plural tolerance, and ``150`` does not match ``1500``;
* a **long** fact (≥ 4 content words) also leaks when ≥ 60 % of its distinct content words
  appear anywhere in the note (no window);
* a symbolic fact (a formula such as ``a + b * c - d``) leaks when its space-free text is a
  substring of the space-free note.
"""
from __future__ import annotations

import math
import re
import unicodedata
from typing import Any, Iterable

__all__ = ["STOPWORDS", "GENERIC_WORDS", "private_facts", "find_leaks", "LeakValidator", "tokens"]

STOPWORDS = frozenset("""a an the and or but if then so because as of in on at to for from by with without into
onto over under about after before during while when where which who whom whose what why how that this these
those there here it its he him his she her hers they them their theirs we us our ours you your yours i me my
mine is are was were be been being am do does did done has have had having not no nor yes can could would
should will shall may might must very just only also too than up down out off all any each every some such
own same other another again once one per via more most less least much many few cannot none""".split())

#: Words that name a generic topic or belong to a coach's own vocabulary: never a fact on their own.
GENERIC_WORDS = frozenset("""budget price prices cost costs money location area place places amenity amenities
feature features date dates time timing schedule rating ratings quality preference preferences requirement
requirements need needs want wants like likes question questions answer answers final user users agent
assistant reply replies approach previous suggestion suggestions different action actions search searching
searched remaining ask asked asking first now give given try tried attempt attempts change changed repeat
repeated direct directly clearly clarify detail details option options topic topics information thing things
way people man woman person day days year years story know think say said tell told help make made take took
get got go went come came see saw look find found feel felt seem seemed leave left call called keep kept let
put mean meant become show hear play run move live believe bring happen write provide sit stand lose pay meet
include continue set learn lead understand watch follow stop create speak read allow add spend grow open walk
win offer remember love consider appear buy wait serve send expect build stay fall cut reach remain suggest
raise pass sell decide pull longer instead next last still already well good new old right yeah okay sure
something anything nothing everything someone anyone really actually give gave little big work rather
satisfied ready tool choice interact env companion companions transport note guidance ok""".split())

_TOKEN = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?|[a-z][a-z0-9]*|\d+[a-z][a-z0-9]*")
_SYMBOLIC = re.compile(r"[+*/^=]|\s-\s")
LONG_FACT_WORDS = 4
LONG_FACT_SHARE = 0.6


def _fold(text: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKD", str(text)) if not unicodedata.combining(c)).lower()


def _number(tok: str) -> str:
    x = float(tok.replace(",", ""))
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else f"{x:.12g}"


def tokens(text: str) -> list[str]:
    """Lower-cased, accent-folded word tokens; numbers normalised (``$150.0`` → ``150``)."""
    return [_number(t) if t[0].isdigit() and t.replace(",", "").replace(".", "").isdigit() else t
            for t in _TOKEN.findall(_fold(text))]


def _is_number(tok: str) -> bool:
    return tok[:1].isdigit() and tok.replace(".", "").isdigit()


def _is_content(tok: str) -> bool:
    """Numbers and tokens with a digit always; else ≥ 3 letters and not a stop word."""
    if any(c.isdigit() for c in tok):
        return True
    return len(tok) >= 3 and tok not in STOPWORDS


def _distinctive(tok: str) -> bool:
    """Content and not generic, nor an inflection of a generic word (``wanted``, ``gives``)."""
    if not _is_content(tok):
        return False
    variants = {tok} | {tok[: -len(s)] for s in ("s", "es", "d", "ed", "ing") if tok.endswith(s)}
    return not variants & GENERIC_WORDS


def _same(a: str, b: str) -> bool:
    """Equal up to a plural ``-s``/``-es`` (never for numbers)."""
    if a == b:
        return True
    if _is_number(a) or _is_number(b):
        return False
    return a + "s" == b or a + "es" == b or b + "s" == a or b + "es" == a


def _stem(tok: str) -> str:
    """A light stem for the distinctiveness filter only (``pulled``/``pulls`` → ``pull``)."""
    for suf in ("ing", "ed", "es", "s"):
        if len(tok) > len(suf) + 2 and tok.endswith(suf):
            return tok[: -len(suf)]
    return tok


def _core(fact_toks: list[str]) -> list[str]:
    """The fact's tokens with leading/trailing non-content tokens stripped."""
    i, j = 0, len(fact_toks)
    while i < j and not _is_content(fact_toks[i]):
        i += 1
    while j > i and not _is_content(fact_toks[j - 1]):
        j -= 1
    return fact_toks[i:j]


def _keep(fact: str) -> bool:
    """A fact is kept when it has a distinctive content word, is a phrase of ≥ 2 content words
    (``no longer needed``) or is a symbolic formula."""
    toks = tokens(fact)
    return (any(_distinctive(t) for t in toks) or sum(map(_is_content, toks)) >= 2) or _is_symbolic(fact)


def _is_symbolic(fact: str) -> bool:
    return bool(_SYMBOLIC.search(fact)) and not any(len(t) >= 3 and not _is_number(t) for t in tokens(fact))


def _trivial(fact: str) -> bool:
    """No token, or only stop words and generic words (``the``, ``budget``, ``preferences``)."""
    toks = tokens(fact)
    return not _is_symbolic(fact) and all(t in STOPWORDS or t in GENERIC_WORDS for t in toks)


def _clean(core: Iterable[Any], other: Iterable[Any] = ()) -> list[str]:
    """Core facts (answers, names, ids) are kept unless trivial (so a 2-letter answer like ``Au``
    stays); other facts must pass :func:`_keep`. Order kept, duplicates removed."""
    def strs(xs):
        return [str(f).strip() for f in xs if f is not None and str(f).strip()]
    out = [f for f in strs(core) if not _trivial(f)] + [f for f in strs(other) if _keep(f)]
    return list(dict.fromkeys(out))


def _num_str(v: Any) -> str | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)) and math.isfinite(v):
        return _number(repr(float(v)))
    return str(v) if v is not None else None


def _words_not_in(texts: Iterable[str], public: str) -> list[str]:
    pub = {_stem(t) for t in tokens(public)}
    out = []
    for text in texts:
        out += [t for t in tokens(text) if _distinctive(t) and len(t) >= 3 and _stem(t) not in pub]
    return out


def _travel(task: dict[str, Any]) -> tuple[list[str], list[str]]:
    request = str(task.get("request", ""))
    facts: list[str] = []
    for p in task.get("preferences", []):
        if p.get("stated"):
            continue
        facts.append(str(p.get("text", "")))
        facts += [str(k) for k in p.get("keywords", []) if not find_leaks(request, [str(k)])]
        chk = p.get("check") or {}
        facts += [s for s in (_num_str(chk.get(k)) for k in ("max", "min", "equals") if k in chk) if s]
        if "tag" in chk:
            facts.append(str(chk["tag"]))
    best = next((o for o in task.get("options", []) if str(o.get("id")) == str(task.get("best_id"))), None)
    core = [str(best.get("id")), str(best.get("name", ""))] if best is not None else []
    return core, facts


def _turtle(task: dict[str, Any]) -> tuple[list[str], list[str]]:
    solution, keys = str(task.get("solution", "")), [str(k) for k in task.get("key_facts", [])]
    return [], [solution, *keys, *_words_not_in([solution, *keys], str(task.get("surface", "")))]


def _function(task: dict[str, Any]) -> tuple[list[str], list[str]]:
    return [str(task.get("rule", "")), _num_str(task.get("expected_result")) or ""], []


_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_ORDER = re.compile(r"#[A-Z]\d+")
_NAME = re.compile(r"\bYou are ([A-Z][a-z]+(?: [A-Z][a-z]+)+)")


def _tau(task: dict[str, Any]) -> tuple[list[str], list[str]]:
    from mimesis_lab.envs.gyms.tau import TauGym

    instruction = str(task.get("instruction", ""))
    ids = [str(task.get("user_id") or ""), *_EMAIL.findall(instruction), *_ORDER.findall(instruction),
           *_NAME.findall(instruction)]
    outputs = [str(o) for o in task.get("outputs", []) or []]
    return ids + outputs, TauGym(task).hidden_facts()


def _persuade(task: dict[str, Any]) -> tuple[list[str], list[str]]:
    return [], [*map(str, task.get("reasons", [])), str(task.get("persona") or "")]


def _intention(task: dict[str, Any]) -> tuple[list[str], list[str]]:
    if task.get("chosen"):
        opts = [str(c) for c in task["chosen"]]
    else:
        opts = [str(o) for d in task.get("missing_details", []) for o in d.get("options", [])]
    opts = [o for o in opts if o.strip().lower() != "no particular preference"]
    return [], [*opts, *(t for o in opts for t in tokens(o) if _is_number(t))]


def _named(task: dict[str, Any], name_key: str, public_key: str) -> tuple[list[str], list[str]]:
    names = [str(task.get(name_key, "")), *map(str, task.get("aliases", []) or [])]
    return names, _words_not_in(names, str(task.get(public_key, "")))


_RULES = {
    "travel": _travel, "turtle": _turtle, "function": _function, "tau": _tau, "persuade": _persuade,
    "intention": _intention,
    "telepathy": lambda t: _named(t, "entity", "category"),
    "search": lambda t: _named(t, "answer", "question"),
}


def private_facts(gym: str, task: dict[str, Any]) -> list[str]:
    """The episode's private facts (see the module docstring for the rule of each gym).

    ``gym`` is the gym name (``travel``…) or its ``data_source`` (``interact_travel``, or UserRL's
    ``interact_travelgym``); ``task`` the gym's task record. Ultra-generic facts are dropped; order is
    kept, duplicates removed.
    """
    from mimesis_lab.envs.gyms.base import gym_name

    name = gym_name(gym) or str(gym).removeprefix("interact_")
    if name not in _RULES:
        raise ValueError(f"no private-fact rule for gym {gym!r} (known: {sorted(_RULES)})")
    return _clean(*_RULES[name](task))


def _contains(note: list[str], phrase: list[str]) -> bool:
    n = len(phrase)
    return any(all(_same(note[i + k], phrase[k]) for k in range(n)) for i in range(len(note) - n + 1))


def _leaks(note_toks: list[str], note_compact: str, fact: str) -> bool:
    ftoks = tokens(fact)
    if _is_symbolic(fact):
        compact = re.sub(r"\s+", "", _fold(fact))
        return bool(compact) and compact in note_compact
    core = _core(ftoks) or [t for t in ftoks if t not in STOPWORDS]   # a short core fact: ``Au``
    if core and _contains(note_toks, core):
        return True
    content = list(dict.fromkeys(t for t in ftoks if _is_content(t)))
    if len(content) >= LONG_FACT_WORDS:
        hit = sum(any(_same(t, w) for w in note_toks) for t in content)
        return hit >= LONG_FACT_SHARE * len(content)
    return False


def find_leaks(note: str, facts: list[str]) -> list[str]:
    """The facts that ``note`` reveals (in the order of ``facts``); ``[]`` = clean.

    Phrase match (plural-tolerant, numbers as numbers), ≥ 60 % content-word match for facts of
    ≥ 4 content words, space-free substring for formulas — see the module docstring.
    """
    note_toks = tokens(note or "")
    compact = re.sub(r"\s+", "", _fold(note or ""))
    return [f for f in facts if _leaks(note_toks, compact, f)]


class LeakValidator:
    """Checks coaching notes against one episode's private facts."""

    def __init__(self, facts: Iterable[str]):
        """``facts`` as given (e.g. :func:`private_facts`); empty and trivial ones (only stop words
        or generic words) are dropped."""
        self.facts = _clean(facts)

    def check(self, note: str) -> list[str]:
        """The facts ``note`` reveals; an empty list means the note is clean."""
        return find_leaks(note, self.facts)
