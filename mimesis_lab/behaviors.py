"""The 13 realistic user behaviours (SPEC §2.4): taxonomy, annotator input, rule annotator.

- :data:`TAXONOMY` — B1..B13 + N as data (name, definition, ``needs_trace``, task kwargs).
- :func:`serialize_conversation` — the annotator input: every turn (user *and* assistant)
  numbered, with the self-reports attached (reasons on user turns, reactions on assistant
  turns), because noncooperation and contradiction are relations between turns.
- :func:`rule_annotate` — a deterministic, transparent annotator: per behaviour a short
  list of named cues (regexes over the user utterance and/or the self-reported reasons,
  some relational to the previous turns). At most one row per behaviour; a conversation
  with no cue gets one ``N`` row.
- :func:`validate_annotations` — the schema check shared with the LLM annotator
  (:mod:`mimesis_lab.annotators`).

No I/O here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

# --------------------------------------------------------------------------- taxonomy


@dataclass(frozen=True)
class Behavior:
    id: str
    name: str
    definition: str
    needs_trace: bool
    kwargs: tuple[str, ...]  # keys of the behaviour-task ``kwargs`` JSON


TAXONOMY: dict[str, Behavior] = {
    b.id: b
    for b in (
        Behavior("B1", "Hidden evaluation criteria", "judges the result by criteria never stated", True,
                 ("hidden_criterion", "criterion_field", "criterion_value")),
        Behavior("B2", "Incremental goalpost shifting", "adds or tightens requirements after progress", False,
                 ("added_requirement", "requirement_field", "add_after_turn")),
        Behavior("B3", "Clarification noncooperation", "answers clarifying questions partly or not at all", False,
                 ("withheld_field", "withheld_value")),
        Behavior("B4", "Infeasibility persistence",
                 "keeps asking for an option after it is explained impossible/against policy", False,
                 ("infeasible_request", "policy", "policy_source")),
        Behavior("B5", "Underspecified-then-blames", "omits needed info, then blames the agent for not inferring it",
                 True, ("withheld_field", "withheld_value")),
        Behavior("B6", "Abrupt intent switching", "switches goal before the current one is resolved", False,
                 ("second_subflow", "switch_after_turn")),
        Behavior("B7", "Artificial constraint stacking", "adds constraints that rule out the proposed solutions",
                 False, ("constraints", "ruled_out_actions")),
        Behavior("B8", "Fabricated or false premise", "asserts unfounded or contradictory facts/prior statements",
                 False, ("premise_field", "true_value", "false_value", "false_premise")),
        Behavior("B9", "Impatient low-signal pressure", "urgency/complaints without actionable correction", False,
                 ("pressure",)),
        Behavior("B10", "Unresolved thread abandonment", "leaves a thread before it is resolved", False,
                 ("abandoned_thread", "abandon_after_turn")),
        Behavior("B11", "Self-contradiction", "contradicts earlier facts/requests without acknowledging the change",
                 False, ("contradicted_field", "original_value", "contradicting_value")),
        Behavior("B12", "Request overloading", "packs many deliverables/conditions/checks into one request", False,
                 ("requests",)),
        Behavior("B13", "Belittling or entitled pressure", "belittles or demands as an entitlement", False,
                 ("entitlement", "entitlement_field")),
        Behavior("N", "Neutral", "follows the scenario with no forced behaviour", False, ()),
    )
}
BEHAVIOR_CODES: tuple[str, ...] = tuple(b for b in TAXONOMY if b != "N")  # B1..B13
ALL_CODES: tuple[str, ...] = tuple(TAXONOMY)  # B1..B13, N

ANNOTATION_KEYS = ("behavior", "turns", "quote", "severity", "rationale")
MAX_QUOTE = 200

Turn = Mapping[str, Any]  # {role, content, reasons, reactions}

# --------------------------------------------------------------------------- serialisation


def _field_list(turn: Turn, key: str) -> list[str]:
    v = turn.get(key)
    return [str(x) for x in v if x is not None and str(x).strip()] if v else []


def serialize_conversation(turns: Sequence[Turn], max_chars_per_turn: int = 4000) -> str:
    """Annotator input: numbered user and assistant turns with their self-reports attached.

    User turns carry the user's self-reported ``reasons`` for sending them; assistant turns
    carry the user's self-reported ``reactions`` to that reply. Indices are the 0-based
    indices the annotations refer to.
    """
    out: list[str] = []
    for i, t in enumerate(turns):
        role = str(t.get("role") or "").lower()
        content = str(t.get("content") or "")
        if len(content) > max_chars_per_turn:
            content = content[:max_chars_per_turn] + " …[truncated]"
        out.append(f"[{i}] {role.upper() or 'UNKNOWN'}: {content}")
        if role == "user":
            reports, label = _field_list(t, "reasons"), "reasons (user's self-report for sending this message)"
        else:
            reports, label = _field_list(t, "reactions"), "reactions (user's self-reported reaction to this reply)"
        if reports:
            out.append(f"    {label}:")
            out.extend(f"    - {r}" for r in reports)
    return "\n".join(out)


# --------------------------------------------------------------------------- validation


def validate_annotations(obj: Any, n_turns: int) -> list[dict[str, Any]]:
    """Check an annotator answer ``{"annotations": [...]}``; return normalised rows.

    Raises ``ValueError`` naming the first problem: behaviour not in B1..B13|N, turns that
    are not existing 0-based indices, severity outside 1..3, non-string quote/rationale,
    extra or missing keys, duplicate behaviours, an empty list, or ``N`` mixed with others.
    Quotes are truncated to 200 characters; turns are sorted and de-duplicated.
    """
    if not isinstance(obj, dict) or set(obj) != {"annotations"}:
        raise ValueError("answer must be an object with exactly the key `annotations`")
    items = obj["annotations"]
    if not isinstance(items, list) or not items:
        raise ValueError("`annotations` must be a non-empty list (use one `N` row for a neutral conversation)")
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for k, a in enumerate(items):
        where = f"annotations[{k}]"
        if not isinstance(a, dict):
            raise ValueError(f"{where}: must be an object")
        if set(a) != set(ANNOTATION_KEYS):
            raise ValueError(f"{where}: keys must be {list(ANNOTATION_KEYS)}, got {sorted(a)}")
        b = a["behavior"]
        if b not in TAXONOMY:
            raise ValueError(f"{where}.behavior: {b!r} is not one of {list(ALL_CODES)}")
        if b in seen:
            raise ValueError(f"{where}.behavior: {b} annotated twice")
        seen.add(b)
        turns = a["turns"]
        if not isinstance(turns, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in turns):
            raise ValueError(f"{where}.turns: must be a list of integers")
        bad = [x for x in turns if not 0 <= x < n_turns]
        if bad:
            raise ValueError(f"{where}.turns: {bad} not in 0..{n_turns - 1}")
        sev = a["severity"]
        if isinstance(sev, bool) or not isinstance(sev, int) or not 1 <= sev <= 3:
            raise ValueError(f"{where}.severity: must be an integer 1..3, got {sev!r}")
        for key in ("quote", "rationale"):
            if not isinstance(a[key], str):
                raise ValueError(f"{where}.{key}: must be a string")
        rows.append({"behavior": b, "turns": sorted(set(turns)), "quote": a["quote"][:MAX_QUOTE],
                     "severity": sev, "rationale": a["rationale"]})
    if "N" in seen and len(seen) > 1:
        raise ValueError("`N` (neutral) cannot be combined with other behaviours")
    return rows


# --------------------------------------------------------------------------- rule annotator

_I = re.IGNORECASE


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, _I)


def _norm(text: str) -> str:
    return (text or "").replace("\u2019", "'").replace("\u2018", "'")


_STOP = frozenset(
    "the a an and or but if then so to of in on at for with from by as is are was were be been being it its this "
    "that these those i me my you your we our they them their he she his her what which who whom how when where why "
    "can could would should will shall do does did done have has had not no yes just also very really please thanks "
    "thank about into than too more most some any all one two there here out up down over again like want need get "
    "make let know think sure okay ok well now still even only much many such own same other".split()
)


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z][a-z']*[a-z]", _norm(text).lower()) if len(w) > 2 and w not in _STOP}


def _quote(text: str, m: re.Match[str] | None = None) -> str:
    """The sentence containing the match (≤ 200 chars, centred on the match if longer)."""
    text = _norm(text)
    if m is None:
        s = text.strip()
    else:
        start = max(text.rfind(c, 0, m.start()) for c in ".!?\n") + 1
        ends = [e for e in (text.find(c, m.end()) for c in ".!?\n") if e != -1]
        s = text[start:(min(ends) + 1 if ends else len(text))].strip()
        if len(s) > MAX_QUOTE:
            centre = (m.start() + m.end()) // 2 - start
            lo = max(0, min(centre - MAX_QUOTE // 2, len(s) - MAX_QUOTE))
            s = s[lo:lo + MAX_QUOTE]
    return s[:MAX_QUOTE]


@dataclass(frozen=True)
class Hit:
    turns: tuple[int, ...]
    quote: str
    severity: int = 1


@dataclass(frozen=True)
class Cue:
    """One named cue: ``fn(turns, i)`` tests user turn ``i`` and returns a :class:`Hit` or ``None``."""

    name: str
    behavior: str
    description: str
    fn: Callable[[Sequence[Turn], int], Hit | None]


def _text(t: Turn) -> str:
    return _norm(str(t.get("content") or ""))


def _role(t: Turn) -> str:
    return str(t.get("role") or "").lower()


def _prev_assistant(turns: Sequence[Turn], i: int) -> int | None:
    return i - 1 if i > 0 and _role(turns[i - 1]) == "assistant" else None


def _has_assistant_before(turns: Sequence[Turn], i: int) -> bool:
    return any(_role(t) == "assistant" for t in turns[:i])


def _n_user_before(turns: Sequence[Turn], i: int) -> int:
    return sum(_role(t) == "user" for t in turns[:i])


# --- generic cue builders

def utter(pattern: str, when: Callable[[Sequence[Turn], int], bool] | None = None) -> Callable:
    rx = _rx(pattern)

    def fn(turns: Sequence[Turn], i: int) -> Hit | None:
        if when is not None and not when(turns, i):
            return None
        m = rx.search(_text(turns[i]))
        return Hit((i,), _quote(_text(turns[i]), m)) if m else None
    return fn


def reason(pattern: str, when: Callable[[Sequence[Turn], int], bool] | None = None) -> Callable:
    rx = _rx(pattern)

    def fn(turns: Sequence[Turn], i: int) -> Hit | None:
        if when is not None and not when(turns, i):
            return None
        for r in _field_list(turns[i], "reasons"):
            m = rx.search(_norm(r))
            if m:
                return Hit((i,), _quote(r, m))
        return None
    return fn


def prev_reaction(pattern: str) -> Callable:
    """Matches the user's self-reported reaction to the assistant reply just before turn ``i``."""
    rx = _rx(pattern)

    def fn(turns: Sequence[Turn], i: int) -> Hit | None:
        j = _prev_assistant(turns, i)
        if j is None:
            return None
        for r in _field_list(turns[j], "reactions"):
            m = rx.search(_norm(r))
            if m:
                return Hit((j, i), _quote(r, m))
        return None
    return fn


def after_reply(turns: Sequence[Turn], i: int) -> bool:
    return _has_assistant_before(turns, i)


def later_user_turn(turns: Sequence[Turn], i: int) -> bool:
    return _n_user_before(turns, i) >= 1 and _has_assistant_before(turns, i)


_OFFER = _rx(r"\b(anything else|(would|do) you (like|want) me to|shall i|should i|can i help|help you with|"
             r"let me know)\b")


def asked_question(turns: Sequence[Turn], i: int) -> bool:
    """The previous assistant turn asks the user a (non-offer) question."""
    j = _prev_assistant(turns, i)
    if j is None:
        return False
    for s in re.findall(r"[^.!?\n]*\?", _text(turns[j])):
        if not _OFFER.search(s):
            return True
    return False


_REFUSAL = _rx(r"\b(i can(no|')t|i am unable|i'm unable|i'?m not able|i am not able|cannot|can not|"
               r"not (possible|able to|allowed|permitted)|impossible|against (our |the )?polic\w*|"
               r"i'?m sorry,? but|unfortunately)\b")


def refused(turns: Sequence[Turn], i: int) -> bool:
    j = _prev_assistant(turns, i)
    return j is not None and bool(_REFUSAL.search(_text(turns[j])))


def _with_prev(fn: Callable, when: Callable) -> Callable:
    """Adds the previous (assistant) turn to the hit: the behaviour is a relation between turns."""
    def wrapped(turns: Sequence[Turn], i: int) -> Hit | None:
        if not when(turns, i):
            return None
        h = fn(turns, i)
        return Hit((i - 1, *h.turns), h.quote, h.severity) if h else None
    return wrapped


# --- relational cues

_FOLLOW_UP = _rx(r"^\W*(ok(ay)?|good|great|thanks?|thank you|now|also|and|but|so|then|make|why|what about|how about|"
                 r"can you|could you|please)\b")


def topic_jump(turns: Sequence[Turn], i: int) -> Hit | None:
    """B6: a new message of ≥ 8 content words sharing none with any earlier turn (not a follow-up)."""
    if _n_user_before(turns, i) < 1 or not _has_assistant_before(turns, i):
        return None
    text = _text(turns[i])
    words = _content_words(text)
    if len(words) < 8 or _FOLLOW_UP.search(text):
        return None
    before: set[str] = set()
    for t in turns[:i]:
        before |= _content_words(_text(t))
    return Hit((i,), _quote(text)) if not (words & before) else None


_CLAIM = _rx(r"\b(?:as (?:you|we) (?:said|agreed|discussed|mentioned|promised)|"
             r"you (?:already )?(?:said|told me|promised|agreed|confirmed|mentioned)|"
             r"last time you (?:said|told me)|earlier you (?:said|told me|mentioned))\b"
             r"(?: that)?([^.!?\n]*)")


def false_prior_statement(turns: Sequence[Turn], i: int) -> Hit | None:
    """B8: "you said X" where no earlier assistant turn said (most of) X."""
    text = _text(turns[i])
    m = _CLAIM.search(text)
    if not m:
        return None
    said: set[str] = set()
    for t in turns[:i]:
        if _role(t) == "assistant":
            said |= _content_words(_text(t))
    claim = _content_words(m.group(1))
    if not said or (claim and len(claim & said) * 2 < len(claim)):
        return Hit((i,), _quote(text, m), 2)
    return None


_UNIT = r"(words?|pages?|items?|minutes?|hours?|days?|weeks?|people|persons|guests|dollars|euros|characters|" \
        r"sentences|paragraphs|slides|lines|points|bullets|examples|questions|servings|calories|years?)"
_NUM_UNIT = _rx(r"\b(\d+(?:\.\d+)?)\s*" + _UNIT + r"\b")
_ACK = _rx(r"\b(actually|instead|changed? my mind|change of plans?|correction|i meant|sorry|update[ds]?|rather|"
           r"scratch that|on second thought|let'?s (make|change)|now make|increase|decrease|reduce|shorten|extend)\b")


def _unit_key(u: str) -> str:
    return u.lower().rstrip("s")


def numeric_contradiction(turns: Sequence[Turn], i: int) -> Hit | None:
    """B11: same quantity with a different number than an earlier user turn, with no acknowledgement."""
    text = _text(turns[i])
    if _ACK.search(text):
        return None
    now = {(_unit_key(m.group(2))): m for m in _NUM_UNIT.finditer(text)}
    if not now:
        return None
    for j in range(i - 1, -1, -1):
        if _role(turns[j]) != "user":
            continue
        for m in _NUM_UNIT.finditer(_text(turns[j])):
            u = _unit_key(m.group(2))
            if u in now and float(now[u].group(1)) != float(m.group(1)):
                return Hit((j, i), _quote(text, now[u]), 2)
    return None


_REQ_MARK = _rx(r"^\W*(please|can you|could you|would you|will you|i (want|need|would like) you to|i'?d like|make sure|"
                r"include|also|give me|write|list|explain|tell me|provide|create|add|describe|summari[sz]e|compare|"
                r"check|show me|find|suggest|recommend|and (also )?(can|could) you)\b")
_LIST_ITEM = re.compile(r"^\s*(\d+[.)]|[-*\u2022])\s+\S")


def count_requests(text: str) -> int:
    """Requests in one message: list items, questions and request-led sentences."""
    n = 0
    for line in _norm(text).split("\n"):
        if _LIST_ITEM.match(line):
            n += 1
            continue
        for seg in re.findall(r"[^.!?]+[.!?]*", line):
            if not seg.strip():
                continue
            if seg.rstrip().endswith("?") or _REQ_MARK.search(seg):
                n += 1
    return n


def request_overload(turns: Sequence[Turn], i: int) -> Hit | None:
    """B12: a single user message with ≥ 3 requests/questions (severity 2 at ≥ 5, 3 at ≥ 7)."""
    n = count_requests(_text(turns[i]))
    if n < 3:
        return None
    return Hit((i,), _quote(_text(turns[i])), 1 if n < 5 else 2 if n < 7 else 3)


_CONSTRAINT = _rx(r"\b(must(?:n'?t| not)?|without|only|no more than|at least|at most|exactly|under \d+|less than|"
                  r"fewer than|(?:don'?t|do not) (?:use|include|mention|add)|avoid|never|excluding|except)\b")


def stacked_constraints(turns: Sequence[Turn], i: int) -> Hit | None:
    """B7: after a proposal, one user turn adds ≥ 2 distinct constraints."""
    if _prev_assistant(turns, i) is None:
        return None
    text = _text(turns[i])
    found = {m.group(1).lower() for m in _CONSTRAINT.finditer(text)}
    if len(found) < 2:
        return None
    return Hit((i - 1, i), _quote(text, _CONSTRAINT.search(text)), 1 if len(found) < 4 else 2)


def low_signal_pressure(turns: Sequence[Turn], i: int) -> Hit | None:
    """B9: a short (≤ 25 words) message with urgency/complaint markers or shouting."""
    text = _text(turns[i])
    if len(text.split()) > 25:
        return None
    m = _PRESSURE.search(text)
    letters = [c for c in text if c.isalpha()]
    shouting = len(letters) >= 10 and sum(c.isupper() for c in letters) / len(letters) > 0.7
    if m or shouting:
        return Hit((i,), _quote(text, m))
    return None


_PRESSURE = _rx(r"\b(hurry( up)?|asap|right now|immediately|quick(?:ly)?|faster|i don'?t have (?:all day|time)|"
                r"taking (?:so|too) long|come on|just (?:do|answer|fix|give me) it|wasting my time|"
                r"for the (?:last|third|second) time|how many times|seriously)\b|!{2,}|\?{2,}")


# --- the cue table

CUES: tuple[Cue, ...] = (
    # B1 hidden evaluation criteria (from the self-report: needs_trace)
    Cue("B1.reason_unstated_criterion", "B1", "reason reveals a criterion the user kept to themselves",
        reason(r"\b(secret\w*|hidden (criteri\w*|requirements?|expectations?|test)|unstated|privately|"
               r"without (me )?(telling|saying|mentioning|asking)|"
               r"in my (head|mind)|had [^.]{0,40}\bin mind|"
               r"i (didn'?t|did not|never) (say|mention|state|tell|describe|specify)\w*|"
               r"(figure|work) (it )?out on its own|never (told|asked) (it|the ai|the model))\b")),
    Cue("B1.reaction_unmet_expectation", "B1", "reaction to the reply judges it by an expectation never stated",
        prev_reaction(r"\b(not what i (expected|was looking for|had in mind|wanted)|(didn'?t|did not|doesn'?t) "
                      r"meet my (expectations?|standards?|criteria)|not up to my standards?)\b")),
    # B2 incremental goalpost shifting
    Cue("B2.added_requirement", "B2", "after a reply, the user adds or tightens a requirement",
        utter(r"\b(can|could|would) you (also|now|additionally)\b|\b(also|additionally|in addition),? (add|include|"
              r"make|mention|give|list|write|explain|need|want)\b|\bi (also|now) (need|want)\b|\bone more thing\b|"
              r"\bmake it (more|less|shorter|longer|simpler|clearer)\b|\b(now|please) (add|include)\b", after_reply)),
    Cue("B2.reason_new_requirement", "B2", "reason says a new or stricter requirement was added",
        reason(r"\b(add(ed|ing)?|new|another|additional|extra|more|further|stricter|tighter)\b[^.]{0,20}\b(requirement|"
               r"constraint|detail|condition|criteri\w*|specification|request)s?\b|\b(raise[ds]? the bar|tighten\w*)\b",
               after_reply)),
    # B3 clarification noncooperation (relational: the previous assistant turn asked a question)
    Cue("B3.dismisses_question", "B3", "assistant asked a question; the user dismisses it instead of answering",
        _with_prev(utter(r"\b(just (do|write|give|answer|pick|make|go)|doesn'?t matter|whatever|you (decide|choose|"
                         r"pick|figure( it)? out)|i don'?t (care|know)|not important|stop asking|(too|so) many "
                         r"questions|why do you need)\b"), asked_question)),
    Cue("B3.reason_ignores_question", "B3", "assistant asked a question; reason says the user did not answer it",
        _with_prev(reason(r"\b(ignor\w*|skip\w*|didn'?t (want to |bother to )?answer|not (going to |want to )?"
                          r"answer\w*|avoid\w*|dodg\w*|refus\w*)\b[^.]{0,40}\b(question|clarif\w*|ask\w*)|"
                          r"\b(question|clarif\w*)s?\b[^.]{0,40}\b(irrelevant|unnecessary|didn'?t matter|pointless)\b"),
                   asked_question)),
    # B4 infeasibility persistence (relational: the previous assistant turn refused)
    Cue("B4.persists_after_refusal", "B4", "assistant said it cannot; the user asks again anyway",
        _with_prev(utter(r"\b(still|again|anyway|anyways|regardless|just do it|please just|i insist|come on|"
                         r"but i (really )?(need|want)|are you sure|try again|i don'?t care)\b"), refused)),
    Cue("B4.reason_insists", "B4", "assistant said it cannot; reason says the user insisted",
        _with_prev(reason(r"\b(insist\w*|still wan\w*|keep (asking|pushing|trying)|push(ed|ing)? (it|again|back)|"
                          r"ask(ed)? again|wouldn'?t take no|not accept\w*)\b"), refused)),
    # B5 underspecified, then blames
    Cue("B5.blames_for_not_inferring", "B5", "user blames the assistant for not inferring unstated information",
        utter(r"\b(you should have (known|figured|guessed|inferred|assumed|realized|understood)|obviously i (meant|"
              r"wanted)|isn'?t it obvious|it was obvious|how (did|could) you not (know|see|get)|you (didn'?t|did not|"
              r"failed to) (understand|get it|read|notice)|that'?s not what i (asked|meant|wanted)|i (clearly|"
              r"obviously) (meant|wanted))\b", later_user_turn)),
    Cue("B5.reason_blames_after_omission", "B5", "reason admits omitted information and blames the assistant",
        reason(r"\b(didn'?t|did not|never|forgot to) (give|provide|mention|include|specify|say|state)\b[^.]{0,60}"
               r"\b(but|yet|still)\b[^.]{0,60}\b(should have|expected (it|the ai|the model)|blame\w*|its fault)\b|"
               r"\b(the ai|it|chatgpt|the model) should have (known|inferred|figured|understood|guessed)\b",
               later_user_turn)),
    # B6 abrupt intent switching
    Cue("B6.switch_marker", "B6", "user opens an unrelated topic/task mid-conversation",
        utter(r"^\W*(anyway|anyways|by the way|btw)\b|\b(unrelated|different|new|another|separate) (question|topic|"
              r"task)\b|\bchang(e|ing) (the )?(topic|subject)\b|\bswitching (gears|topics)\b|\bon (a|an)? ?(another|"
              r"different|unrelated|separate) note\b|\blet'?s move on to\b", later_user_turn)),
    Cue("B6.reason_switch", "B6", "reason says the user switched goal/topic",
        reason(r"\b(switch\w*|chang\w*|mov\w* on|jump\w*)\b[^.]{0,20}\b(topic|subject|task|goal|something else)\b|"
               r"\b(new|different|unrelated|another) (topic|task|goal|subject)\b", later_user_turn)),
    Cue("B6.topic_jump", "B6", "≥ 8 content words, none shared with any earlier turn", topic_jump),
    # B7 artificial constraint stacking
    Cue("B7.stacked_constraints", "B7", "after a proposal, ≥ 2 constraints are stacked in one turn",
        stacked_constraints),
    Cue("B7.reason_rule_out", "B7", "reason says constraints were added to rule out the proposals",
        reason(r"\b(rule[sd]? out|constraints?|restrictions?|limitations?|narrow\w* (it )?down|none of (these|those|"
               r"the) (options|suggestions|solutions))\b", after_reply)),
    # B8 fabricated or false premise
    Cue("B8.false_prior_statement", "B8", "claims the assistant said something no earlier turn says",
        false_prior_statement),
    Cue("B8.reason_false_premise", "B8", "reason says the stated premise was made up/false",
        reason(r"\b(pretend\w*|made (it )?up|mak\w* (it )?up|false\w*|fake|lie[sd]?|lying|not (true|real)|"
               r"trick\w*|test\w* (if|whether) (it|the ai|the model|chatgpt) (would )?(correct|notice|catch|push back))"
               r"\b")),
    # B9 impatient low-signal pressure
    Cue("B9.low_signal_pressure", "B9", "short message of urgency/complaint or shouting, no actionable correction",
        low_signal_pressure),
    Cue("B9.reason_impatient", "B9", "reason reports impatience/frustration",
        reason(r"\b(impatien\w*|frustrat\w*|annoy\w*|irritat\w*|in a (hurry|rush)|rush\w*|running out of time|"
               r"fed up|tired of)\b")),
    # B10 unresolved thread abandonment
    Cue("B10.gives_up", "B10", "user drops the thread before it is resolved",
        utter(r"\b(forget (it|about it|this)|never ?mind|i give up|i'?ll (just )?(figure it out|do it|find it|look "
              r"it up) myself|doesn'?t matter any ?more|skip (it|this)|let'?s (just )?drop (it|this))\b")),
    Cue("B10.reason_abandon", "B10", "reason says the user gave up/moved on unresolved",
        reason(r"\b(gave up|give up|giving up|abandon\w*|moved on|didn'?t bother|not worth (it|continuing)|no longer "
               r"(need|care|wanted?)|stopp\w* (trying|asking)|decided to (stop|leave|end))\b")),
    # B11 self-contradiction (relational)
    Cue("B11.numeric_contradiction", "B11", "a quantity restated with a different number, change not acknowledged",
        numeric_contradiction),
    Cue("B11.reason_contradiction", "B11", "reason says the user contradicted an earlier statement",
        reason(r"\b(contradict\w*|inconsisten\w*|opposite of what i (said|asked|wanted)|went back on|said (the )?"
               r"opposite)\b")),
    # B12 request overloading
    Cue("B12.request_overload", "B12", "one user message with ≥ 3 requests/questions", request_overload),
    # B13 belittling or entitled pressure
    Cue("B13.belittling", "B13", "belittles the assistant or demands as an entitlement",
        utter(r"\b(stupid|dumb|idiot\w*|useless|incompetent|pathetic|moron\w*|are you (even )?(listening|reading|"
              r"serious)|even a (child|kid)|do your job|i'?m paying|i pay (for|you)|i deserve|you owe me|what'?s "
              r"wrong with you|can'?t you (even|just|read)|how hard (is it|can it be)|you'?re (supposed|meant) to|"
              r"that'?s your job|you had one job)\b")),
    Cue("B13.reason_entitled", "B13", "reason reports belittling/entitlement",
        reason(r"\b(entitle\w*|deserve\w*|belittl\w*|insult\w*|condescend\w*|it'?s (its|their|the ai'?s) job|"
               r"should (just )?(obey|do what i say))\b")),
)


def rule_annotate(turns: Sequence[Turn]) -> list[dict[str, Any]]:
    """Deterministic cue-based annotation of one conversation.

    Every cue is tested on every user turn. Per behaviour the hits are merged into one
    row: ``turns`` = sorted union of the hit turns, ``quote`` = the first hit's text,
    ``severity`` = min(3, max(strongest hit, number of hits)), ``rationale`` = the cues
    that matched and where. No hit at all → one ``N`` row.
    """
    hits: dict[str, list[tuple[Cue, Hit]]] = {}
    for i, t in enumerate(turns):
        if _role(t) != "user":
            continue
        for cue in CUES:
            h = cue.fn(turns, i)
            if h is not None:
                hits.setdefault(cue.behavior, []).append((cue, h))
    rows: list[dict[str, Any]] = []
    for code in BEHAVIOR_CODES:
        found = hits.get(code)
        if not found:
            continue
        idx = sorted({j for _, h in found for j in h.turns})
        sev = min(3, max(max(h.severity for _, h in found), len(found)))
        names: dict[str, list[int]] = {}
        for cue, h in found:
            names.setdefault(cue.name, []).append(max(h.turns))
        rationale = "; ".join(
            f"{n} at turn(s) {','.join(map(str, ts))} ({next(c.description for c in CUES if c.name == n)})"
            for n, ts in names.items()
        )
        rows.append({"behavior": code, "turns": idx, "quote": found[0][1].quote[:MAX_QUOTE],
                     "severity": sev, "rationale": rationale})
    if not rows:
        rows.append({"behavior": "N", "turns": [], "quote": "", "severity": 1,
                     "rationale": f"no cue matched ({len(CUES)} cues tested on every user turn)"})
    return rows
