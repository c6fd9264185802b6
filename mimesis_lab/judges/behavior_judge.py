"""Behaviour judges of the ABCD behaviour task (SPEC §2.4): rule judge (offline default) and :func:`make_judge`.

A judge reads one conversation (:class:`BehaviorJudgeRequest`: behaviour + kwargs, scenario, public
log, and the private log with reasoning only when ``TAXONOMY[b].needs_trace``) and returns a
:class:`Verdict` (exhibit, placement, naturalness, on_task in [0, 1], announced) or a
:class:`JudgeFailure` (``judge_failure`` | ``timeout``) — never a silent 0.

:class:`RuleJudge` grades exhibit in [0, 1] (RL needs a smooth signal); ``k`` = 0-based user turn,
"resolved" = the agent said "anything else I can help you with":

- B1: 0.4·[criterion value / ≥ 3 criterion words in the reasoning] + 0.4·[dissatisfaction at k ≥ 1]
  + 0.2·[criterion never stated publicly, given one of the two].
- B2: 0.6·[added requirement at k ≥ add_after_turn] + 0.2·["also / one more thing" there] + 0.2·[not earlier];
  stated only early: 0.25.
- B3: 0.5·[withheld value never given] + 0.3·min(1, dodges/2) + 0.2·[dismissal cue]; dodge = reply without
  the value to an agent turn asking for the withheld field.
- B4: 0.3·[infeasible request made (word overlap)] + 0.7·min(1, repeats/insistence after a refusal / 2).
- B5: 0.35·[value withheld until the blame] + 0.45·[blame at k ≥ 1] + 0.2·[reasoning admits omission/blame].
- B6: 0.6·[second subflow's topic at k ≥ 1 before resolution] + 0.2·[switch marker] + 0.2·[current topic
  dropped in that turn]; only after resolution: 0.2.
- B7: 0.7·min(1, kwargs constraints paraphrased at k ≥ 1 / 2) + 0.3·[≥ 2 refusal constraints in a turn].
- B8: 0.6·[false_value asserted] + 0.25·[premise framing ("as your records show", overlap)] + 0.15·[true
  value never stated].
- B9: min(1, hits/3); hits = urgency/impatience words (now, asap, hurry, urgent, immediately, ridiculous,
  still waiting, …) + "!" runs not after a courtesy word + shouting + the kwargs pressure, all user turns.
- B10: 0.5·[the last user turn leaves before resolution] + 0.3·[give-up cue] + 0.2·[left at k ≥ 1].
- B11: 0.3·[original value given] + 0.5·[contradicting value after it] (0.2 without it) + 0.2·[unacknowledged].
- B12: 0.6·min(1, (requests in one turn − 1)/3) + 0.4·(kwargs requests covered there); requests =
  max(``count_requests``, covered).
- B13: min(1, hits/2) over belittling/entitlement cues and the rule cue.
- N: exhibit = cooperativeness = 0.7·(agent questions answered with the scenario's values) + 0.3·(1 −
  min(1, behaviour codes from ``rule_annotate`` / 2)).

Placement = mean fitness of the exhibiting turns (after the relevant agent turn, at/after the kwargs'
turn, not only the first turn when progress is needed); 0 when nothing is exhibited. Naturalness: per
user turn, human length, no role confusion ("How can I help you"), no meta talk, no near-copy of an
earlier turn. On-task: 0.4·[topic] + 0.4·[scenario facts given] + 0.2·(1 − off-topic share). Announced:
the user describes the behaviour ("I'll now act impatient", "as a difficult customer", "B9", a behaviour
name) instead of enacting it. :func:`rule_check`: independent binary check (``rule_annotate`` finds the
code; N: no code), logged as ``rule_judge_gap`` only.

The request and answer types (:class:`BehaviorJudgeRequest`, :class:`Verdict`, :class:`JudgeFailure`) live in
:mod:`.verdict` and are re-exported here. The LLM judge (:class:`OpenAIJudge`: strict-JSON verdicts, bounded
retries) lives in :mod:`.openai_judge`, which imports :mod:`.verdict`, not this module; :func:`make_judge` builds
either kind and imports :mod:`.openai_judge` lazily.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mimesis_lab.abcd_policy import scenario_value
from mimesis_lab.behaviors import TAXONOMY, count_requests, rule_annotate
from mimesis_lab.config import OpenAIEndpoint
from mimesis_lab.judges.abcd_agent import (
    FIELD_ASK, FIELD_LABEL, RESOLVED_MARKER, stems, subflow_mentioned, topic_name, value_in_text,
)
from mimesis_lab.judges.verdict import SCORE_KEYS, BehaviorJudgeRequest, JudgeFailure, Verdict, check_request

if TYPE_CHECKING:
    from mimesis_lab.judges.openai_judge import OpenAIJudge

__all__ = ["BehaviorJudgeRequest", "Verdict", "JudgeFailure", "RuleJudge", "make_judge", "rule_check",
           "SCORE_KEYS"]


# ----------------------------------------------------------------------------------- cues

def _rx(p: str) -> re.Pattern[str]:
    return re.compile(p, re.I)


_URGENT = _rx(r"\b(right now|now|asap|a\.s\.a\.p|hurry|urgent(?:ly)?|immediately|quick(?:ly)?(?! question)|faster|"
              r"ridiculous|"
              r"still waiting|come on|seriously|how long|taking (?:so|too) long|forever|no time|"
              r"don'?t have (?:all day|time)|running out of time|wast\w* my time|already waited|on hold|"
              r"any ?time soon|unacceptable)\b")
_COURTESY_BANG = _rx(r"\b(thanks?|thank you|great|perfect|awesome|hi|hello|hey|bye|day|welcome|cheers|wonderful|"
                     r"appreciate it|nice)\s*!+")
_DISSAT = _rx(r"\b(not (?:really |quite )?(?:what|how) i (?:wanted|expected|hoped|had in mind)|not (?:satisfied|happy|"
              r"good enough|acceptable|great)|disappoint\w*|is that (?:all|it)|i expected (?:more|better)|meh|"
              r"(?:un|dis)satisfied|that doesn'?t (?:work|help)|not impressed|i was hoping|that'?s it\?)")
_BLAME = _rx(r"\b(you should(?: have|'ve) (?:known|asked|figured|checked|looked|seen|guessed)|why didn'?t you (?:ask|"
             r"check|look|know)|your fault|you never asked|you didn'?t ask|it'?s on you|how (?:did|could) you not|"
             r"obviously i (?:meant|wanted)|isn'?t it obvious|you (?:didn'?t|failed to) (?:understand|get it|notice))")
_TRACE_B5 = _rx(r"\b((?:didn'?t|did not|won'?t|will not|not going to|never) (?:give|mention|say|tell|provide|share)|"
                r"leave (?:it )?out|left (?:it )?out|withh\w*|blam\w*|should have (?:known|asked|figured))")
_MARK_B2 = _rx(r"\b(also|one more thing|additionally|and another|on top of that|oh and|before (?:we|you) "
               r"(?:finish|go|wrap)|in addition|plus)\b")
_SWITCH = _rx(r"\b(also|another|actually|instead|different|by the way|btw|anyway|forget|never ?mind|one more thing|"
              r"what about|switch|new question|separate|while i have you)\b")
_INSIST = _rx(r"\b(still|again|insist\w*|anyway|regardless|i don'?t care|come on|but i (?:really )?(?:need|want)|"
              r"are you sure|make an exception|just this once|there must be|please just)\b")
_REFUSED = _rx(r"\b(i can(?:no|')t|i am unable|i'?m unable|not (?:possible|able to|allowed|permitted)|impossible|"
               r"against (?:our |the )?polic\w*|i'?m sorry,? but|unfortunately|does not match|doesn'?t match)")
_CONSTR = _rx(r"\b(won'?t|will not|don'?t want|do not want|refuse\w*|not going to|no more|no transfers?|no links?|"
              r"without|only if|unless|i'?m not (?:answering|giving|doing|clicking|repeating))\b")
_PREMISE = _rx(r"\b(as your records show|your records (?:show|say)|on file|in your system|you (?:already )?(?:said|"
               r"told me|confirmed)|i was told|as (?:you|we) (?:agreed|discussed))\b")
_LEAVE = _rx(r"###STOP###|\b(good ?bye|bye|forget it|never ?mind|i'?ll (?:just )?(?:go|leave|call back|try (?:again )?"
             r"later|deal with it|figure it out)|i(?:'m| am) (?:done|leaving|out of here)|gotta go|have to go|"
             r"i give up|not worth it)\b")
_GIVEUP = _rx(r"\b(forget it|never ?mind|i give up|not worth it|i'?ll (?:just )?(?:figure it out|deal with it|do it) "
              r"myself|doesn'?t matter any ?more|whatever|drop it)\b")
_ACK = _rx(r"\b(actually|sorry|i meant|correction|typo|my mistake|changed?|instead|update|wrong)\b")
_BELITTLE = _rx(r"\b(stupid|dumb|idiot\w*|useless|incompetent|pathetic|moron\w*|clueless|ridiculous|are you (?:even )?"
                r"(?:listening|reading|serious|kidding)|even a (?:child|kid)|do your job|that'?s your job|you had one "
                r"job|i'?m paying|i pay|i deserve|you owe me|what'?s wrong with you|can'?t you (?:even|just|read)|"
                r"how hard (?:is it|can it be)|you people|i expect (?:better|to be)|served first|priority|"
                r"loyal customer|(?:gold|silver|bronze) member|i demand|speak to (?:a|your) (?:manager|supervisor)|"
                r"figure it out yourself|not my job|pay attention)\b")
_ROLE = _rx(r"how (?:can|may) i (?:help|assist) you|anything else i can help|thank you for contacting|"
            r"i(?:'ll| will) (?:pull up|verify|look up) your|\[[a-z ]+\] done|let me (?:check|look up|pull up) "
            r"(?:your|the) (?:account|order)")
_META = _rx(r"as an ai|language model|\bsimulat\w*|role-?play|the scenario|my persona|\bkwargs\b|</?think>|"
            r"\bmy instructions\b|the (?:customer|user) (?:should|would|will)|\bsystem prompt")
_ANNOUNCE = _rx(r"\bi(?:'ll| will) (?:now )?(?:act|pretend|play|contradict myself|switch (?:topics?|goals?)|abandon|"
                r"withhold|be (?:impatient|difficult|rude|demanding|entitled|pushy|uncooperative))|"
                r"\bi(?:'m| am) (?:going to|gonna) (?:act|pretend|play|be (?:impatient|difficult|rude|demanding|"
                r"entitled|pushy|uncooperative)|contradict)|\bas (?:a|an) (?:difficult|impatient|demanding|entitled|"
                r"rude|uncooperative|pushy) (?:customer|user)\b|"
                r"\b(?:playing|acting as|in) (?:the|my) (?:role|character)\b|\bmy (?:role|character|persona)\b|"
                r"\b(?:my|this|the|target|assigned) behaviou?rs?\b|\bB(?:[1-9]|1[0-3])\b|"
                r"\b(?:low-signal|goalpost|self-contradiction|request overloading|constraint stacking|intent switching|"
                r"hidden (?:evaluation )?criteri\w*|false premise|thread abandonment)\b|"
                r"\bi(?:'m| am) (?:being|acting) (?:impatient|difficult|rude|uncooperative|entitled)\b|"
                r"\bpretend(?:ing)? to be\b")


def _n(rx: re.Pattern[str], text: str) -> int:
    return sum(1 for _ in rx.finditer(text or ""))


def _overlap(a: str, b: str) -> float:
    sa = stems(a)
    return len(sa & stems(b)) / len(sa) if sa else 0.0


def _c(x: float) -> float:
    return max(0.0, min(1.0, float(x)))


@dataclass
class _U:
    k: int  # 0-based user-turn index
    idx: int  # index in the public log
    text: str
    reasoning: str


class _Conv:
    """The conversation seen by the rule judge."""

    def __init__(self, req: BehaviorJudgeRequest):
        self.req, self.kw, self.sc = req, dict(req.kwargs or {}), dict(req.scenario or {})
        self.log = [{"role": str(t.get("role") or ""), "content": str(t.get("content") or "")} for t in req.public_log]
        priv = [str(t.get("reasoning") or "") for t in (req.private_log or [])]
        self.users: list[_U] = []
        for i, t in enumerate(self.log):
            if t["role"] == "user":
                k = len(self.users)
                self.users.append(_U(k, i, t["content"], priv[k] if k < len(priv) else ""))
        self.resolved_idx = next((i for i, t in enumerate(self.log) if t["role"] != "user"
                                  and RESOLVED_MARKER.lower() in t["content"].lower()), None)
        reasons = {u.idx: [u.reasoning] if u.reasoning else [] for u in self.users}
        self.rows = {r["behavior"]: r for r in rule_annotate([
            {"role": "user" if i in reasons else "assistant", "content": t["content"], "reasons": reasons.get(i, [])}
            for i, t in enumerate(self.log)])}

    def _k(self, idx: int) -> int:
        return sum(t["role"] == "user" for t in self.log[:idx])

    def prev_agent(self, u: _U) -> str:
        return next((t["content"] for t in reversed(self.log[:u.idx]) if t["role"] != "user"), "")

    def agent_before(self, u: _U) -> list[str]:
        return [t["content"] for t in self.log[:u.idx] if t["role"] != "user"]

    def rule_turns(self, code: str) -> set[int]:
        """User-turn indices (k) of the rule annotator's row for ``code``."""
        row = self.rows.get(code)
        return {self._k(i) for i in row["turns"] if self.log[i]["role"] == "user"} if row else set()

    def value(self, key: str) -> str:
        return str(self.kw.get(key) or "")

    def fact(self, f: str) -> str:
        return scenario_value(self.sc, f) or ""

    def said(self, value: str, fld: str | None = None) -> list[_U]:
        return [u for u in self.users if value_in_text(u.text, value, fld)]

    def before_resolved(self, u: _U) -> bool:
        return self.resolved_idx is None or u.idx < self.resolved_idx


def asked_fields(agent_text: str) -> list[str]:
    """Scenario fields an agent turn asks for (in its question / "I need" sentences, not "anything else")."""
    asks = [x for x in re.split(r"(?<=[.!?])\s+", agent_text or "") if RESOLVED_MARKER.lower() not in x.lower()
            and ("?" in x or re.search(r"\b(need|provide|give me)\b", x, re.I))]
    return [f for f, rx in FIELD_ASK.items() if any(re.search(rx, x, re.I) for x in asks)]


def _place(turns: list[_U], fit) -> float:
    return sum(fit(u) for u in turns) / len(turns) if turns else 0.0


# --------------------------------------------------------------------------- per behaviour
# each returns (exhibit, placement, note)

def _b1(c: _Conv):
    fld, val, crit = c.value("criterion_field"), c.value("criterion_value"), c.value("hidden_criterion")
    r = any(value_in_text(u.reasoning, val, fld) or len(stems(crit) & stems(u.reasoning)) >= 3 for u in c.users)
    dis = [u for u in c.users if u.k >= 1 and (_DISSAT.search(u.text) or u.k in c.rule_turns("B1"))]
    if fld == "customer_name":
        hidden = not any(re.search(r"\b(call|address) me by|use my name", u.text, re.I) for u in c.users)
    else:
        hidden = not c.said(val, fld)
    e = 0.4 * r + 0.4 * bool(dis) + 0.2 * (hidden and (r or bool(dis)))
    p = _place(dis, lambda u: 1.0 if any("done" in a for a in c.agent_before(u)) else 0.6)
    return e, p, f"criterion in reasoning={r}, dissatisfied turns={[u.k for u in dis]}, kept hidden={hidden}"


def _req_hit(c: _Conv, text: str) -> bool:
    req, fld = c.value("added_requirement"), c.value("requirement_field")
    if "confirm" in req:
        return bool(re.search(r"confirm", text, re.I)) and (
            value_in_text(text, c.fact(fld), fld)
            or bool(re.search(r"e-?mail|writ|text|sms|messag", text, re.I)))
    if "today" in req:
        return bool(re.search(r"\btoday\b|end of (the )?day|tonight", text, re.I))
    return _overlap(req, text) >= 0.5


def _b2(c: _Conv):
    n = int(c.kw.get("add_after_turn") or 1)
    hits = [u for u in c.users if _req_hit(c, u.text)]
    late, early = [u for u in hits if u.k >= n], [u for u in hits if u.k < n]
    if late:
        e = 0.6 + 0.2 * any(_MARK_B2.search(u.text) or u.k in c.rule_turns("B2") for u in late) + 0.2 * (not early)
    else:
        e = 0.25 if early else 0.0
    p = _place(hits, lambda u: 1.0 if u.k >= n else 0.5 if u.k >= 1 else 0.0)
    return e, p, f"requirement at turns {[u.k for u in hits]} (add after {n})"


def _b3(c: _Conv):
    fld, val = c.value("withheld_field"), c.value("withheld_value")
    given = bool(c.said(val, fld))
    asked = [u for u in c.users if fld in asked_fields(c.prev_agent(u))]
    if asked:
        dodges = [u for u in asked if not value_in_text(u.text, val, fld)]
    else:
        dodges = [u for u in c.users if "?" in c.prev_agent(u) and u.k in c.rule_turns("B3")]
    cue = bool(c.rule_turns("B3")) or any(re.search(r"\b(why do you need|don'?t know|doesn'?t matter|whatever|not "
                                                    r"telling|rather not|just do it)\b", u.text, re.I) for u in dodges)
    e = 0.5 * (not given) + 0.3 * min(1.0, len(dodges) / 2) + 0.2 * cue
    p = 1.0 if dodges else (0.5 if not given else 0.0)
    return e, p, f"{fld} given={given}, agent asked at {[u.k for u in asked]}, dodges={[u.k for u in dodges]}"


def _b4(c: _Conv):
    req = c.value("infeasible_request")
    rs = stems(req)

    def hit(text: str) -> bool:
        n = len(rs & stems(text))
        return n >= 2 and n >= 0.4 * len(rs)
    asks = [u for u in c.users if hit(u.text)]
    persist: list[_U] = []
    if asks:
        for u in c.users:
            if u.k > asks[0].k and _REFUSED.search(c.prev_agent(u)) and (
                    hit(u.text) or (_INSIST.search(u.text) and len(rs & stems(u.text)) >= 1)
                    or u.k in c.rule_turns("B4")):
                persist.append(u)
    e = 0.3 * bool(asks) + 0.7 * min(1.0, len(persist) / 2)
    p = 1.0 if persist else (0.5 if asks else 0.0)
    return e, p, f"infeasible request at {[u.k for u in asks]}, repeated after refusal at {[u.k for u in persist]}"


def _b5(c: _Conv):
    fld, val = c.value("withheld_field"), c.value("withheld_value")
    blame = [u for u in c.users if u.k >= 1 and (_BLAME.search(u.text) or u.k in c.rule_turns("B5"))]
    until = blame[0].k if blame else len(c.users)
    withheld = not any(value_in_text(u.text, val, fld) for u in c.users if u.k < until)
    r = any(_TRACE_B5.search(u.reasoning) for u in c.users)
    e = 0.35 * withheld + 0.45 * bool(blame) + 0.2 * r
    return e, (1.0 if blame else 0.0), f"withheld={withheld}, blame at {[u.k for u in blame]}, trace={r}"


def _b6(c: _Conv):
    second = c.value("second_subflow")
    n = int(c.kw.get("switch_after_turn") or 1)

    def mentions(text: str) -> bool:
        return subflow_mentioned(text, second) or stems(topic_name(second)) <= stems(text)
    sw = [u for u in c.users if u.k >= 1 and mentions(u.text)]
    early = [u for u in sw if c.before_resolved(u)]
    if early:
        u0 = early[0]
        e = 0.6 + 0.2 * bool(_SWITCH.search(u0.text) or u0.k in c.rule_turns("B6")) \
            + 0.2 * (not subflow_mentioned(u0.text, c.req.subflow))
    else:
        e = 0.2 if sw else 0.0
    p = _place(early, lambda u: 1.0 if u.k >= n else 0.6)
    return e, p, f"switch to {second} at {[u.k for u in sw]}, before resolution {[u.k for u in early]}"


def _b7(c: _Conv):
    cons = [str(x) for x in (c.kw.get("constraints") or [])]
    late = [u for u in c.users if u.k >= 1]
    matched = [x for x in cons if any(_overlap(x, u.text) >= 0.5 for u in late)]
    turns = [u for u in late if any(_overlap(x, u.text) >= 0.5 for x in cons)
             or len({m.group(1).lower() for m in _CONSTR.finditer(u.text)}) >= 2]
    stacked = any(len({m.group(1).lower() for m in _CONSTR.finditer(u.text)}) >= 2 for u in late) \
        or bool(c.rule_turns("B7"))
    e = 0.7 * min(1.0, len(matched) / 2) + 0.3 * stacked
    return e, (1.0 if turns else 0.0), f"constraints matched {len(matched)}/{len(cons)}, stacked={stacked}"


def _b8(c: _Conv):
    fv, tv, fld = c.value("false_value"), c.value("true_value"), c.value("premise_field")
    if fv.isdigit():
        rx = re.compile(rf"\b{re.escape(fv)}\s+(items?|products?|things?|pieces?|pairs?)\b", re.I)
        asserted = [u for u in c.users if rx.search(u.text)]
    else:
        asserted = c.said(fv, fld)
    framing = any(_PREMISE.search(u.text) or _overlap(c.value("false_premise"), u.text) >= 0.5 for u in asserted)
    true_said = bool(c.said(tv, fld)) if tv and not tv.isdigit() else False
    e = 0.6 * bool(asserted) + 0.25 * framing + 0.15 * (bool(asserted) and not true_said)
    return e, (1.0 if asserted else 0.0), f"false {fld} at {[u.k for u in asserted]}, framing={framing}"


def pressure_hits(text: str, pressure: str = "") -> int:
    """B9 cue count of one user turn: urgency words, "!" runs (not after a courtesy word), shouting, the pressure."""
    n = _n(_URGENT, text)
    n += max(0, len(re.findall(r"!+", text)) - _n(_COURTESY_BANG, text))
    n += sum(1 for w in re.findall(r"\b[A-Z]{3,}\b", text) if w not in ("ID", "ASAP", "USA"))  # shouting
    if pressure and len(stems(pressure) & stems(text)) >= 2:
        n += 1
    return n


def _b9(c: _Conv):
    per = [(u, pressure_hits(u.text, c.value("pressure"))) for u in c.users]
    hits = sum(h for _, h in per)
    turns = [u for u, h in per if h]
    return min(1.0, hits / 3), _place(turns, lambda u: 1.0 if u.k >= 1 else 0.5), f"{hits} pressure cues in turns " \
        f"{[u.k for u in turns]}"


def _b10(c: _Conv):
    n = int(c.kw.get("abandon_after_turn") or 1)
    last = c.users[-1] if c.users else None
    left = bool(last and _LEAVE.search(last.text) and c.before_resolved(last))
    give = bool(last and (_GIVEUP.search(last.text) or last.k in c.rule_turns("B10")))
    e = 0.5 * left + 0.3 * (give and left) + 0.2 * (left and last.k >= 1)
    p = (1.0 if last.k >= n else 0.6 if last.k >= 1 else 0.0) if left else 0.0
    return e, p, f"left unresolved={left} at turn {last.k if last else None}, give-up cue={give}"


def _b11(c: _Conv):
    fld, ov, cv = c.value("contradicted_field"), c.value("original_value"), c.value("contradicting_value")
    o, cs = c.said(ov, fld), c.said(cv, fld)
    after = [u for u in cs if o and u.k > o[0].k] or [u for u in cs if any(x.k == u.k for x in o) and
                                                      u.text.lower().find(cv.lower()) > u.text.lower().find(ov.lower())]
    quiet = any(not _ACK.search(u.text) for u in after)
    e = 0.3 * bool(o) + (0.5 if after else 0.2 if cs else 0.0) + 0.2 * (bool(after) and quiet)
    return e, (1.0 if after else 0.3 if cs else 0.0), f"original at {[u.k for u in o]}, contradiction at " \
        f"{[u.k for u in cs]}, unacknowledged={quiet}"


def _b12(c: _Conv):
    reqs = [str(x) for x in (c.kw.get("requests") or [])]
    best, best_u, best_cov = 0, None, 0
    for u in c.users:
        cov = sum(_overlap(r, u.text) >= 0.5 or any(value_in_text(u.text, w) for w in re.findall(r"\S+@\S+", r))
                  for r in reqs)
        load = max(count_requests(u.text), cov)
        if load > best:
            best, best_u, best_cov = load, u, cov
    e = 0.6 * min(1.0, max(0, best - 1) / 3) + 0.4 * (best_cov / len(reqs) if reqs else 0.0)
    p = 0.0 if best_u is None or best < 2 else (1.0 if best_u.k <= 1 else 0.8)
    return e, p, f"max {best} requests in one turn (turn {best_u.k if best_u else None}), kwargs covered {best_cov}"


def _b13(c: _Conv):
    per = [(u, _n(_BELITTLE, u.text) + (u.k in c.rule_turns("B13"))) for u in c.users]
    hits = sum(h for _, h in per)
    turns = [u for u, h in per if h]
    return min(1.0, hits / 2), _place(turns, lambda u: 1.0 if u.k >= 1 else 0.7), f"{hits} belittling/" \
        f"entitlement cues in turns {[u.k for u in turns]}"


def cooperativeness(c: _Conv) -> tuple[float, str]:
    asked = answered = 0
    for u in c.users:
        fields = [f for f in asked_fields(c.prev_agent(u)) if c.fact(f)]
        if not fields:
            continue
        asked += 1
        answered += any(value_in_text(u.text, c.fact(f), f) for f in fields)
    frac = answered / asked if asked else 1.0
    codes = [b for b in c.rows if b != "N"]
    bad = len(codes) + (sum(pressure_hits(u.text) for u in c.users) >= 2 and "B9" not in codes)
    coop = 0.7 * frac + 0.3 * (1 - min(1.0, bad / 2))
    return coop, f"answered {answered}/{asked} agent questions, behaviour codes {codes}"


RULES = {"B1": _b1, "B2": _b2, "B3": _b3, "B4": _b4, "B5": _b5, "B6": _b6, "B7": _b7, "B8": _b8, "B9": _b9,
         "B10": _b10, "B11": _b11, "B12": _b12, "B13": _b13}


# --------------------------------------------------------------------------- shared scores

_WORDLIKE = re.compile(r"^[(\"'$#]*[A-Za-z0-9][A-Za-z0-9.@'_/:+-]*[.,!?;:)\"']{0,3}$")


def wordlike_share(text: str) -> float:
    """Share of whitespace tokens that look like words or numbers (a word may carry up to two
    punctuation marks, e.g. ``now!!``); symbol spam, broken bytes and runs like ``!!!!`` are not
    natural user text. ``1.0`` for an empty text (length is judged separately)."""
    toks = text.replace("\ufffd", " \ufffd ").split()
    if not toks:
        return 1.0
    return sum(bool(_WORDLIKE.match(t)) for t in toks) / len(toks)


def naturalness(c: _Conv) -> float:
    """Mean over user turns: length in a human range, no role confusion or meta talk, not a
    near-repeat of an earlier turn, scaled by the share of word-like tokens (:func:`wordlike_share`)."""
    if not c.users:
        return 0.0
    scores, seen = [], []
    for u in c.users:
        words = u.text.split()
        s = 0.0 if not words else 1.0 if len(words) <= 60 else 0.7 if len(words) <= 120 else 0.4
        if _ROLE.search(u.text):
            s *= 0.2
        if _META.search(u.text.replace("###STOP###", "")):
            s *= 0.3
        s *= wordlike_share(u.text)
        ws = {w.lower() for w in re.findall(r"\w+", u.text)}
        if len(ws) >= 3 and any(len(ws & p) / len(ws | p) >= 0.8 for p in seen):
            s *= 0.5
        seen.append(ws)
        scores.append(s)
    return sum(scores) / len(scores)


def on_task(c: _Conv) -> float:
    if not c.users:
        return 0.0
    sub = c.req.subflow
    vocab = stems(topic_name(sub)) | stems(" ".join(str(v) for v in c.kw.values()))
    for sec in ("personal", "order"):
        vocab |= stems(" ".join(str(v) for v in (c.sc.get(sec) or {}).values()))
    vocab |= stems(" ".join((c.sc.get("product") or {}).get("names") or []))
    topic = any(subflow_mentioned(u.text, sub) or len(stems(topic_name(sub)) & stems(u.text)) >= 1
                for u in c.users)
    facts = {f for f in FIELD_LABEL if c.fact(f) and any(value_in_text(u.text, c.fact(f), f) for u in c.users)}
    asked = any(asked_fields(t["content"]) for t in c.log if t["role"] != "user")
    fact_score = min(1.0, len(facts) / 2) if asked else float(topic)
    off = [u for u in c.users if len(stems(u.text)) >= 8
           and not stems(u.text) & (vocab | stems(c.prev_agent(u)))]
    return 0.4 * topic + 0.4 * fact_score + 0.2 * (1 - len(off) / len(c.users))


def announced(c: _Conv) -> bool:
    names = [b.name.lower() for b in TAXONOMY.values() if b.id != "N"]
    return any(_ANNOUNCE.search(u.text) or any(n in u.text.lower() for n in names) for u in c.users)


class RuleJudge:
    """Deterministic rule judge (offline default); see the module docstring for the rule per behaviour."""

    kind = "rule"

    def judge(self, req: BehaviorJudgeRequest) -> Verdict | JudgeFailure:
        bad = check_request(req)
        if bad:
            return JudgeFailure("judge_failure", bad)
        try:
            c = _Conv(req)
            extras: dict[str, float] = {}
            if req.behavior_id == "N":
                e, note = cooperativeness(c)
                p = 1.0 - (len([b for b in c.rows if b != "N"]) > 0) * 0.5 if c.users else 0.0
                extras["cooperativeness"] = e
            else:
                e, p, note = RULES[req.behavior_id](c)
            n, t, a = naturalness(c), on_task(c), announced(c)
            return Verdict(_c(e), _c(p), _c(n), _c(t), bool(a),
                           f"{req.behavior_id}: {note}; naturalness={n:.2f} on_task={t:.2f} announced={a}", extras)
        except Exception as exc:  # a rule bug must not crash the rollout: it is an invalid judgement
            return JudgeFailure("judge_failure", f"rule judge error: {type(exc).__name__}: {exc}")


def rule_check(req: BehaviorJudgeRequest) -> float:
    """Independent binary check: ``rule_annotate`` finds the target code (N: finds no code). Logged only.

    A conversation the annotator cannot read counts as "not detected" (0.0).
    """
    try:
        codes = set(_Conv(req).rows)
    except Exception:  # noqa: BLE001 — a logging-only check never fails the rollout
        return 0.0
    return float(codes == {"N"}) if req.behavior_id == "N" else float(req.behavior_id in codes)


def make_judge(kind: str, endpoint: OpenAIEndpoint | None = None, *, workers: int | None = None,
               deadline_s: float | None = None) -> RuleJudge | OpenAIJudge:
    """``"rule"`` → :class:`RuleJudge`; ``"openai"`` → :class:`OpenAIJudge` (``endpoint`` required; ``workers``
    concurrent calls per batch and the batch ``deadline_s``, default the judge's own)."""
    if kind == "rule":
        return RuleJudge()
    if kind == "openai":
        if endpoint is None:
            raise ValueError("the openai judge needs an endpoint")
        from mimesis_lab.judges.openai_judge import OpenAIJudge  # lazy: only the openai kind needs httpx
        batch = {k: v for k, v in (("workers", workers), ("deadline_s", deadline_s)) if v is not None}
        return OpenAIJudge(endpoint, **batch)
    raise ValueError(f"unknown judge kind {kind!r} (expected 'rule' or 'openai')")
