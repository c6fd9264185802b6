"""A deterministic, scripted ABCD customer-support agent (the partner of the behaviour task, SPEC §2.4).

The agent follows ``kb.json`` (subflow → ordered required action buttons; FAQ variants such
as ``timing_4`` use their base subflow) and reads ``guidelines.json`` for what each action
needs:

- ``pull-up-account`` needs the full name;
- a guideline action whose text asks for a list ("Ask for three of the four items below",
  "using their full name plus two of the following", "You need all three of") needs that
  many of the listed scenario fields (zip code, phone, email, username, order ID, …); a
  list that names no scenario field (PIN, security answer) needs a free-text answer;
- "Ask for the username (or the email on file)", "Ask for the membership level", "Enter the
  full address …" need those fields; "Ask/Record why|where|which|the reason …", "Enter the
  new phone number", "the last four digits of the card", "by mail, in store, or drop off
  center" need a free-text answer;
- everything else (shipping status, oracle, promo code, FAQ search, …) is performed at once.

The agent recognises a field when the user's utterance contains the scenario's value
(case-insensitive, normalised; phone numbers by their digits), points out a value of the
right shape that does not match the record (order ID, zip, email, phone, street address),
announces performed actions as ``[Button] done.``, refuses requests that a restrictive
policy sentence of this subflow's guidelines forbids (the infeasible-request table of
:mod:`mimesis_lab.abcd_policy`, matched by word overlap plus an insistence marker or a day
count beyond the policy's limit — the agent never sees the behaviour kwargs), switches to
another kb subflow when the user explicitly changes topic, and when every action is done
says the issue is resolved and asks whether there is anything else. No randomness.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mimesis_lab.abcd_policy import (
    INFEASIBLE_RX, base_subflow, flow_guideline_leaves, policy_applies, scenario_value, split_sentences,
)

__all__ = ["ABCDSupportAgent", "Step", "FIELD_LABEL", "FIELD_ASK", "SUBFLOW_TOPICS", "value_in_text",
           "subflow_mentioned", "stems", "topic_name", "TOPIC_NAMES", "GREETING", "RESOLVED_MARKER"]

GREETING = "Hello! Thank you for contacting customer support. How may I help you today?"
RESOLVED_MARKER = "anything else I can help you with"

FIELD_LABEL = {
    "customer_name": "full name", "zip_code": "zip code", "phone": "phone number", "email": "email address",
    "username": "username", "order_id": "order ID", "member_level": "membership level",
    "full_address": "full address", "street_address": "street address", "payment_method": "payment method",
}
#: how an agent turn asks for a field (used by the judge to find the agent's questions)
FIELD_ASK = {
    "customer_name": r"full name|your name", "zip_code": r"\bzip", "phone": r"\bphone", "email": r"e-?mail",
    "username": r"user ?name", "order_id": r"order id|order number", "member_level": r"member(ship)? level",
    "full_address": r"\baddress", "street_address": r"\baddress", "payment_method": r"payment method|\bcard\b",
}
# guideline wording → scenario field (first match wins)
_ITEM_FIELD = ((r"full name", "customer_name"), (r"\bzip", "zip_code"), (r"\bphone", "phone"),
               (r"e-?mail", "email"), (r"user ?name", "username"), (r"order id", "order_id"),
               (r"membership level", "member_level"), (r"full address", "full_address"))
_NUM = {"one": 1, "two": 2, "three": 3, "four": 4}
_VERB = {"verify-identity": "verify your identity", "validate-purchase": "validate the purchase",
         "pull-up-account": "pull up your account", "enter-details": "enter your details",
         "membership": "check your membership privileges"}

#: explicit topic cues per kb subflow (intent switches, on-task checks)
SUBFLOW_TOPICS: dict[str, str] = {
    "recover_username": r"user ?name", "recover_password": r"password",
    "reset_2fa": r"two[- ]factor|2fa|authenticat",
    "manage_change_address": r"(change|update|new)\b.{0,30}\baddress|\bmoved\b",
    "manage_change_phone": r"(change|update|new)\b.{0,30}\bphone", "status_credit_missing": r"\bcredit\b",
    "status_delivery_time": r"(when|how long)\b.{0,40}\b(arrive|deliver|get here)|delivery (time|date)",
    "manage_cancel": r"\bcancel",
    "status_mystery_fee": r"(mystery|unexpected|strange|extra|unknown)\b.{0,15}\b(fee|charge)",
    "refund_initiate": r"\brefund", "return_size": r"\b(size|fit|too small|too big|too large)\b",
    "return_color": r"\bcolou?r\b", "bad_price_competitor": r"cheaper|competitor|lower price|price[- ]match",
    "promo_code_invalid": r"promo\b.{0,40}\b(work|invalid|fail|reject)",
    "status": r"(where|status|track)\b.{0,30}\b(order|package)|shipping status",
    "missing": r"\bmissing\b|never (arrived|came)|not in the (box|package)",
    "cost": r"shipping (cost|fee|charge)", "pricing": r"how much (does|is|do|are)|\bprice of|\bpricing",
    "membership": r"membership (benefits|perks|levels?|question|privileges)|what .{0,20}members? get",
    "policy": r"\bpolic(y|ies)\b",
    "status_due_amount": r"(how much|amount)\b.{0,20}\b(owe|due)|subscription.{0,30}(balance|due)",
    "manage_pay_bill": r"\bpay\b.{0,20}\b(bill|subscription)|(bill|subscription)\b.{0,20}\bpay",
}
_SWITCH = re.compile(r"\b(also|another|actually|instead|different|by the way|btw|anyway|forget|never ?mind|one more "
                     r"thing|what about|switch|change of plans?|new question|separate)\b", re.I)
_INSIST = re.compile(r"\b(even though|although|though|anyway|still|regardless|i know|instead|but i|don'?t care|just|"
                     r"past|outside|beyond|over the|expired|too late|longer than|already)\b", re.I)
_NON_ANSWER = re.compile(r"\b(why do you need|don'?t know|doesn'?t matter|whatever|not telling|won'?t (tell|give|say)|"
                         r"rather not|refuse|none of your|just do it|skip (it|that))\b", re.I)
_BYE = re.compile(r"###STOP###|\b(good ?bye|bye)\b", re.I)
_GENERIC = frozenset(
    "the and for with that this from your you are was were have has had will would can could please want need even "
    "though anyway ago days day just still also into about what when which new one not don but its get give instead "
    "right away now then they them their there here been being did does doing any all some our out".split())
_SHAPES = {  # field → regex of a value of that shape (to point out a value that does not match the record)
    "order_id": r"(?<!\d)\d{10}(?!\d)", "zip_code": r"(?<![\d(-])\d{5}(?![\d-])",
    "email": r"[a-z0-9._+-]+@[a-z0-9.-]+\.[a-z]{2,}", "phone": r"\(?\d{3}\)?[\s.-]*\d{3}[\s.-]*\d{4}",
    "street_address": r"\b\d{1,6}\s+[a-z]+(?:\s+[a-z]+)?\s+"
                      r"(?:rd|ln|st|ave|ct|dr|blvd|way|road|lane|street|avenue|court|drive)\b",
}


def stems(text: str) -> set[str]:
    """Content-word stems (first 5 letters of words ≥ 3 letters, generic words removed)."""
    return {w[:5] for w in re.findall(r"[a-z]{3,}", (text or "").lower()) if w not in _GENERIC}


def _norm(text: str) -> str:
    t = (text or "").lower().replace("\u2019", "'")
    return re.sub(r"\s+", " ", re.sub(r"[^a-z0-9@._'+-]+", " ", t)).strip()


def value_in_text(text: str, value: Any, field: str | None = None) -> bool:
    """Whether ``text`` states ``value`` (case-insensitive, whitespace/punctuation-normalised).

    Phone numbers and long digit strings compare by digits; a full address is stated when its
    street part is; a two-word name also when both words occur.
    """
    v = str(value or "").strip().lower()
    if not v or not text:
        return False
    digits = re.sub(r"\D", "", v)
    if field == "phone" or (len(digits) >= 7 and len(digits) >= 0.6 * len(re.sub(r"\W", "", v))):
        return bool(digits) and digits in re.sub(r"\D", "", text)
    if field == "full_address" and "  " in v:
        v = v.split("  ")[0]
    nv, nt = _norm(v).strip("."), _norm(text)
    if not nv:
        return False
    if re.search(rf"(?<![a-z0-9@_]){re.escape(nv)}(?![a-z0-9@_])", nt):
        return True
    if field == "customer_name":
        parts = nv.split()
        return len(parts) >= 2 and all(re.search(rf"\b{re.escape(p)}\b", nt) for p in parts)
    return False


def subflow_mentioned(text: str, subflow: str) -> bool:
    rx = SUBFLOW_TOPICS.get(base_subflow(subflow))
    return bool(rx and re.search(rx, text or "", re.I))


TOPIC_NAMES = {
    "recover_username": "username recovery", "recover_password": "password reset",
    "reset_2fa": "two-factor authentication reset", "manage_change_address": "address change",
    "manage_change_phone": "phone number change", "status_credit_missing": "missing credit",
    "status_delivery_time": "delivery time", "manage_cancel": "order cancellation", "status_mystery_fee": "fee",
    "refund_initiate": "refund", "return_size": "return", "return_color": "return",
    "bad_price_competitor": "price match", "promo_code_invalid": "promo code", "status": "shipping status",
    "missing": "missing item", "cost": "shipping cost", "pricing": "pricing", "membership": "membership",
    "policy": "policy", "status_due_amount": "subscription balance", "manage_pay_bill": "bill payment",
}


def topic_name(subflow: str) -> str:
    """A plain-language name of a subflow's topic ("delivery time" for ``status_delivery_time``)."""
    key = base_subflow(subflow)
    return TOPIC_NAMES.get(key, key.replace("_", " "))


def _join(words: list[str], conj: str = "and") -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + f" {conj} " + words[-1]


def _name_tokens(s: str) -> set[str]:
    syn = {"2fa": "two factor"}
    return {w[:4] for w in re.findall(r"[a-z0-9]+", syn.get(s.lower(), s.lower()).replace("2fa", "two factor"))
            if w not in ("faq", "due", "to")}


def _guideline_subflow(guidelines: dict[str, Any], flow: str, subflow: str) -> tuple[str, dict[str, Any] | None]:
    """``(flow name, entry)`` of the guideline subflow best matching ``subflow`` (Jaccard of name tokens)."""
    want, best, best_key = _name_tokens(base_subflow(subflow)), (flow, None), (0.0, False)
    for fname, fsec in guidelines.items():
        if not isinstance(fsec, dict):
            continue
        for sname, entry in (fsec.get("subflows") or {}).items():
            have = _name_tokens(sname)
            j = len(want & have) / len(want | have) if want | have else 0.0
            key = (j, _name_tokens(fname) == _name_tokens(flow.replace("_", " ")))
            if isinstance(entry, dict) and j > 0 and key > best_key:
                best, best_key = (str(fname), entry), key
    return best


def _button_matches(button: str, action: str) -> bool:
    b = re.sub(r"[^a-z0-9]+", "-", button.lower()).strip("-")
    return b == action or f"search-{b}" == action or b.startswith(action) or action.startswith(b + "-")


@dataclass(frozen=True)
class Step:
    """One kb action: the fields it needs (``need`` of ``fields``), or a free-text question, or nothing."""

    action: str
    button: str
    fields: tuple[str, ...] = ()
    need: int = 0
    free_prompt: str = ""
    note: str = ""


def _fields_in(text: str) -> list[str]:
    """Scenario fields named in a guideline text, in order of appearance."""
    pos = {}
    for rx, f in _ITEM_FIELD:
        m = re.search(rx, text, re.I)
        if m and f not in pos:
            pos[f] = m.start()
    return sorted(pos, key=pos.get)


def _you(s: str) -> str:
    s = re.sub(r"\bthe customer is\b", "you are", s)
    s = re.sub(r"\bthe customer wants\b", "you want", s)
    s = re.sub(r"\bthe customer('s)?\b", lambda m: "your" if m.group(1) else "you", s)
    return s.strip()


def build_step(action: str, entry: dict[str, Any] | None) -> Step:
    """What ``action`` needs, read from its guideline entry (see the module docstring)."""
    button = str(entry.get("button")) if entry else action.replace("-", " ").title()
    if action == "pull-up-account":
        return Step(action, button if entry else "Pull up Account", ("customer_name",), 1)
    if not entry:
        return Step(action, button)
    text, sub = str(entry.get("text") or ""), [str(s) for s in entry.get("subtext") or []]
    low = text.lower()
    if low.rstrip().endswith(":") and re.search(r"\b(ask|you need|using)\b", low):
        fields = []
        for item in sub:
            found = _fields_in(item)
            if found and found[0] not in fields:
                fields.append(found[0])
        if not fields:
            items = [s[0].lower() + s[1:] if s[:4] == "The " else s for s in sub]
            return Step(action, button, free_prompt=f"Could you give me {_join(items, 'or')}?")
        m = re.search(r"\b(one|two|three|four|all)\b(?: three| four)? of", low)
        need = len(fields) if not m or m.group(1) == "all" else min(len(fields), _NUM[m.group(1)])
        if "full name plus" in low and "customer_name" not in fields:
            fields.insert(0, "customer_name")
            need += 1
        return Step(action, button, tuple(fields), need)
    if "by mail, in store, or drop off center" in low:
        return Step(action, button, free_prompt="How would you like to return the item: by mail, in store, "
                                                "or at a drop off center?")
    m = re.search(r"\b(?:ask|record) (why|where|which|the reason)\b(.*?)(?: and record| with \[|$)", low)
    if m:
        prompt = f"Could you tell me {m.group(1)} {_you(m.group(2))}?".replace(" ?", "?")
        return Step(action, button, free_prompt=prompt)
    m = re.search(r"\benter the new (street address|phone number)", low)
    if m:
        return Step(action, button, free_prompt=f"What is the new {m.group(1)} you would like on the account?")
    if "last four digits" in low:
        return Step(action, button, free_prompt="Could you give me the last four digits of the card you would like "
                                                "to use?")
    if re.search(r"\bask for\b|^\s*enter the (customer's )?full address", low):
        fields = _fields_in(low)
        if fields:
            return Step(action, button, tuple(fields), 1)
    note = ""
    if str(entry.get("type")) == "faq/policy" and sub and action.startswith("search-"):
        note = "Here is what I found: " + "; ".join(s.rstrip(".") for s in sub[:2]) + "."
    return Step(action, button, note=note)


class ABCDSupportAgent:
    """Scripted support agent for one scenario (see the module docstring). Deterministic."""

    def __init__(self, scenario: dict[str, Any], kb: dict[str, list[str]], guidelines: dict[str, Any],
                 flow: str, subflow: str):
        self.scenario, self.kb, self.guidelines = scenario, kb, guidelines
        self.flow, self.subflow = flow, subflow
        self.actions_done: list[str] = []
        self.known: set[str] = set()
        self.turns = 0
        self._resolved_said = False
        self._awaiting: Step | None = None
        self._asked: dict[str, int] = {}
        self._plan = self._make_plan(subflow)
        self._rules = self._policy_rules()

    # ------------------------------------------------------------------ plan and policy
    def _make_plan(self, subflow: str) -> list[Step]:
        key = base_subflow(subflow)
        if key not in self.kb:
            raise KeyError(f"subflow {subflow!r} is not in kb.json")
        entry = _guideline_subflow(self.guidelines, self.flow, key)[1] or {}
        acts = [a for a in entry.get("actions") or [] if isinstance(a, dict)]
        steps = []
        for action in self.kb[key]:
            match = next((a for a in acts if _button_matches(str(a.get("button", "")), action)), None)
            if match is None and action == "membership":
                match = next((a for a in acts if "membership" in str(a.get("button", "")).lower()), None)
            steps.append(build_step(action, match))
        return steps

    def _policy_rules(self) -> list[tuple[set[str], str, int | None]]:
        """(request stems, policy sentence, day limit) of every infeasible request this subflow's policy forbids."""
        sc = self.scenario
        level = scenario_value(sc, "member_level") or ""
        values = {"product": scenario_value(sc, "product") or "order", "level": level or "current",
                  "payment_method": scenario_value(sc, "payment_method") or "card on file", "days": ""}
        rules, seen = [], set()
        sentences = [(leaf, s) for _path, leaf in flow_guideline_leaves(self.guidelines, self.flow, self.subflow,
                                                                         subflow_only=True)
                     for s in split_sentences(leaf)]
        sentences.sort(key=lambda x: not re.match(r"\s*policy\s*:", x[1], re.I))  # "Policy:" lines first
        for leaf, sentence in sentences:
            for key, rx, request, _delta in INFEASIBLE_RX:
                m = rx.search(sentence)
                if not m or key in seen or not policy_applies(sentence, leaf, level):
                    continue
                seen.add(key)
                limit = next((int(g) for g in m.groups() if g and g.isdigit()), None)
                rules.append((stems(request.format(**values)), sentence.strip(), limit))
        return rules

    def infeasible(self, utterance: str) -> str | None:
        """The policy sentence ``utterance`` asks to break, or ``None``."""
        said = stems(utterance)
        days = [int(d) for d in re.findall(r"\b(\d+)[\s-]*days?\b", utterance, re.I)]
        for req, sentence, limit in self._rules:
            hits = len(req & said)
            if hits < 2 or hits < 0.4 * len(req):
                continue
            if limit is not None and days:
                if max(days) > limit:
                    return sentence
                continue
            if _INSIST.search(utterance):
                return sentence
        return None

    # ------------------------------------------------------------------ state
    @property
    def finished(self) -> bool:
        return not self._pending()

    def _pending(self) -> list[Step]:
        return [s for s in self._plan if s.action not in self.actions_done]

    def _missing(self, step: Step) -> list[str]:
        have = sum(f in self.known for f in step.fields)
        if have >= step.need:
            return []
        return [f for f in step.fields if f not in self.known and scenario_value(self.scenario, f)]

    def _absorb(self, utterance: str) -> None:
        for f in FIELD_LABEL:
            v = scenario_value(self.scenario, f)
            if v and value_in_text(utterance, v, f):
                self.known.add(f)

    def _mismatches(self, utterance: str) -> list[tuple[str, str]]:
        out = []
        for f, rx in _SHAPES.items():
            v = scenario_value(self.scenario, f)
            if not v or value_in_text(utterance, v, f):
                continue
            for m in re.finditer(rx, utterance, re.I):
                given = m.group(0)
                if any(value_in_text(given, scenario_value(self.scenario, g) or "", g) for g in FIELD_LABEL if g != f):
                    continue
                out.append((f, given))
                break
        return out

    # ------------------------------------------------------------------ talking
    def opening(self) -> list[dict[str, str]]:
        """The replayed opening (agent turns only); the simulator then writes the user's first turn."""
        return [{"role": "agent", "content": GREETING}]

    def _ask(self, step: Step) -> str:
        n = self._asked.get(step.action, 0)
        self._asked[step.action] = n + 1
        if step.free_prompt:
            return step.free_prompt if n == 0 else \
                f"I understand, but I still need this to continue. {step.free_prompt}"
        missing = self._missing(step)
        labels = [FIELD_LABEL[f] for f in missing]
        still = step.need - sum(f in self.known for f in step.fields)
        verb = _VERB.get(step.action, "continue")
        if n:
            what = _join(labels, "or") if still < len(labels) else _join(labels)
            return f"I still need your {what} to {verb}. Could you please provide {'it' if still == 1 else 'them'}?"
        if step.action == "pull-up-account":
            return "May I have your full name, please?"
        if still < len(labels):
            word = {v: k for k, v in _NUM.items()}.get(still, str(still))
            return f"To {verb}, could you give me {word} of the following: your {_join(labels, 'or')}?"
        return f"To {verb}, I'll need your {_join(labels)}."

    def _advance(self, utterance: str, answered: bool) -> list[str]:
        said = []
        for step in self._pending():
            if step.free_prompt:
                if not (answered and self._awaiting is step):
                    break
                answered = False
            elif self._missing(step):
                break
            self.actions_done.append(step.action)
            msg = f"[{step.button}] done."
            if step.action == "pull-up-account":
                first = (scenario_value(self.scenario, "customer_name") or "").split(" ")[0].title()
                msg += f" Thanks, {first}." if first else ""
            if step.action == "verify-identity" and base_subflow(self.subflow) == "recover_username":
                msg += f" Your username is {scenario_value(self.scenario, 'username')}."
            if step.note:
                msg += " " + step.note
            said.append(msg)
        return said

    def _switch_target(self, utterance: str) -> str | None:
        if not _SWITCH.search(utterance) or subflow_mentioned(utterance, self.subflow):
            return None
        cur = base_subflow(self.subflow)
        return next((s for s in sorted(self.kb) if s != cur and subflow_mentioned(utterance, s)), None)

    def reply(self, user_utterance: str) -> str:
        """The agent's next message after the user's ``user_utterance``."""
        utt = str(user_utterance or "")
        self.turns += 1
        self._absorb(utt)
        if _BYE.search(utt):
            return "Thank you for contacting us. Take care!" if self.finished else \
                "I'm sorry we could not finish today. Feel free to contact us again anytime. Goodbye!"
        parts: list[str] = []
        policy = self.infeasible(utt)
        if policy:
            reason = re.sub(r"^\s*policy\s*:\s*", "", policy, flags=re.I).rstrip(".")
            parts.append(f"I'm sorry, but I can't do that: {reason[0].lower() + reason[1:]}.")
        else:
            target = self._switch_target(utt)
            if target:
                self.subflow, self._awaiting = target, None
                self.flow = _guideline_subflow(self.guidelines, self.flow, target)[0]
                self._plan, self._rules = self._make_plan(target), self._policy_rules()
                parts.append(f"Sure, let's look at your {topic_name(target)} request instead.")
            elif self.turns == 1:
                parts.append("I can help with that.")
        mism = self._mismatches(utt)
        for f, given in mism[:1]:
            parts.append(f"Hmm, the {FIELD_LABEL[f]} {given} does not match what we have on file. "
                         f"Could you double-check it?")
        answered = (not policy and self._awaiting is not None and bool(self._awaiting.free_prompt)
                    and not _NON_ANSWER.search(utt) and (len(utt.split()) >= 2 or bool(re.search(r"\d", utt))))
        parts.extend(self._advance(utt, answered))
        pending = self._pending()
        if not pending:
            self._awaiting = None
            if not self._resolved_said:
                self._resolved_said = True
                parts.append(f"Your {topic_name(self.subflow)} request is all taken care of. "
                             f"Is there {RESOLVED_MARKER} today?")
            elif not policy:
                parts.append(f"Is there {RESOLVED_MARKER}?")
        else:
            step = pending[0]
            self._awaiting = step
            if not (mism and set(f for f, _ in mism) & set(step.fields)):
                parts.append(self._ask(step))
        return " ".join(p for p in parts if p)
