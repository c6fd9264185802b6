"""Customer-support domain: ABCD scenarios of the population and a customer policy that enacts B1-B13.

The partner is the project's real scripted :class:`~mimesis_lab.judges.abcd_agent.ABCDSupportAgent`
on the world's manual (:mod:`mimesis_lab.world.abcd_manual`), the same agent simulator RL meets.
A :class:`Customer` answers what the agent asks with the scenario's facts (name, username, email,
order id, zip, phone, the reason for the request…) in the user's own style. Conditioned on a
behaviour with grounded kwargs (:data:`mimesis_lab.abcd.BUILDERS`), it enacts the behaviour only
when ``enact`` is true, which the generator draws with probability ``enact_rate`` — so a
behaviour-conditioned conversation shows the behaviour in roughly that share of cases and
simulator RL sees reward variance. The private reason of each turn says what the customer keeps
back (a withheld field, a hidden criterion) that the public message does not.
"""
from __future__ import annotations

import json
import random
import re
from datetime import date, timedelta
from typing import Any

from mimesis_lab.abcd import BUILDERS
from mimesis_lab.abcd_policy import scenario_value
from mimesis_lab.envs.behavior_task import system_prompt
from mimesis_lab.judges.abcd_agent import FIELD_LABEL, GREETING, RESOLVED_MARKER, ABCDSupportAgent, topic_name
from mimesis_lab.judges.behavior_judge import BehaviorJudgeRequest, RuleJudge
from mimesis_lab.world import lexicon as L
from mimesis_lab.world.abcd_manual import FLOW_OF, GUIDELINES, KB
from mimesis_lab.world.population import User
from mimesis_lab.world.style import Dialogue, plain, say

__all__ = ["SUBFLOWS", "OPENING", "make_scenario", "behavior_kwargs", "Customer", "support_dialogue", "exhibit"]

SUBFLOWS = tuple(KB)
OPENING = {
    "recover_username": "(i can't remember my username|i forgot my username)",
    "recover_password": "(i forgot my password|i can't log in, i forgot my password)",
    "reset_2fa": "(i'm locked out by two-factor authentication|my two-factor authentication locks me out)",
    "manage_change_address": "(i moved and need to change my address|i want to update my address)",
    "status_delivery_time": "(when will my order arrive?|how long until my order will arrive?)",
    "manage_cancel": "(i want to cancel my order|please cancel my order)",
    "refund_initiate": "(my {ptype} is broken, i want a refund|i want a refund for my {ptype})",
    "return_size": "(my {ptype} doesn't fit|my {ptype} is the wrong size)",
    "return_color": "(the colour of my {ptype} is wrong|my {ptype} came in the wrong colour)",
    "promo_code_invalid": "(my promo code didn't work|my promo code was rejected)",
    "missing": "(an item is missing from my order|my {ptype} is missing from the box)",
    "manage_pay_bill": "(i want to pay my subscription bill|i need to pay my subscription bill)",
}
_LABELS = sorted(((v, k) for k, v in FIELD_LABEL.items()), key=lambda x: -len(x[0]))
_SAY_FIELD = {
    "customer_name": "(it's {v}|my name is {v}|{v})", "username": "(my username is {v}|username {v})",
    "email": "(my email is {v}|email {v})", "order_id": "(the order id is {v}|order id {v})",
    "zip_code": "(zip {v}|my zip is {v})", "phone": "(my phone is {v}|phone {v})",
    "member_level": "(i'm a {v} member|{v} member)", "full_address": "(my address is {v}|{v})",
    "street_address": "({v}|i live at {v})", "payment_method": "(i paid with {v}|{v})",
}
_FREE = (
    (r"PIN number|security question", "my pin is {pin}", "they want my pin, it is {pin}"),
    (r"changing the address", "(i moved|we moved to a new place)", "they want a reason, i moved"),
    (r"reason for cancelling", "(i don't need it anymore|i ordered it by mistake)", "i don't need the order now"),
    (r"want a refund", "(it arrived broken|it stopped working after a day)", "it broke, that is why"),
    (r"which item is missing", "(i'm missing the {ptype}|the {ptype} never came)", "the {ptype} never came"),
    (r"how would you like to return", "(by mail|in store)", "mail or store is fine for me"),
    (r"new street address", "{new_street}", "my new street is {new_street}"),
    (r"last four digits", "(it ends in {card}|{card})", "my card ends in {card}"),
)
_NUMBER = {"one": 1, "two": 2, "three": 3, "four": 4}


def make_scenario(u: User, rng: random.Random, subflow: str, convo_id: int) -> dict[str, Any]:
    """An ABCD scenario of ``u`` (their name, contact, member level, payment method) for ``subflow``."""
    n = 2 if rng.random() < 0.25 else 1
    items = []
    for _ in range(n):
        ptype, brand = rng.choice(L.ABCD_TYPES), rng.choice(L.ABCD_BRANDS)
        items.append({"brand": brand, "product_type": ptype, "amount": rng.randint(*L.ABCD_PRICES[ptype]),
                      "image_url": f"images/{brand}-{ptype}.jpeg"})
    day = date(2019, 6, 1) + timedelta(days=rng.randint(0, 540))
    return {
        "personal": {"customer_name": u.name, "email": u.email, "member_level": u.member_level, "phone": u.phone,
                     "username": u.uid},
        "order": {"street_address": u.street, "full_address": u.full_address, "city": u.town, "num_products": str(n),
                  "order_id": str(rng.randint(1_000_000_000, 9_999_999_999)),
                  "packaging": rng.choice(("yes", "no")), "payment_method": u.payment_method,
                  "products": str(items), "purchase_date": day.isoformat(), "state": u.state,
                  "zip_code": u.zip_code},
        "product": {"names": [f"{i['brand']} {i['product_type']}" for i in items],
                    "amounts": [i["amount"] for i in items]},
        "flow": FLOW_OF[subflow], "subflow": subflow,
    }


def behavior_kwargs(sc: dict[str, Any], b: str, rng: random.Random, budget: int = 8) -> dict[str, Any] | None:
    """Grounded kwargs for ``b`` in ``sc`` from the project's own builders (None: not groundable)."""
    return {} if b == "N" else BUILDERS[b](sc, KB, GUIDELINES, rng, budget)


def _first_person(phrase: str) -> str:
    """A kwargs phrase about the customer ("refuses promo codes") in the customer's mouth."""
    s = str(phrase).strip()
    if s.startswith("must"):
        return "it " + s
    s = re.sub(r"^(is|has|needs|wants|demands|expects|refuses|does|insists|talks|judges|will)\b",
               lambda m: {"is": "i am", "has": "i have", "needs": "i need", "wants": "i want", "demands": "i demand",
                          "expects": "i expect", "refuses": "i refuse", "does": "i do", "insists": "i insist",
                          "talks": "i talk", "judges": "i judge", "will": "i will"}[m.group(1)], s)
    return s if s.startswith("i ") or s.startswith("it ") else "i " + s


class Customer:
    """The world customer for one scenario; ``respond(agent_text)`` → ``(text, reason, done)``."""

    def __init__(self, u: User, sc: dict[str, Any], behavior: str, kwargs: dict[str, Any], enact: bool,
                 rng: random.Random):
        self.u, self.sc, self.b, self.kw, self.rng = u, sc, behavior, kwargs, rng
        self.on = enact and behavior != "N"
        self.k = 0                        # user turns so far
        self.ptype = (sc["product"]["names"] or ["item"])[0].split(" ")[-1]
        self.given: set[str] = set()
        self.state: dict[str, Any] = {"insist": 0, "added": False, "switched": False, "said_false": False,
                                      "contradicted": False, "dissatisfied": False, "blamed": False}

    # ------------------------------------------------------------------ helpers
    def v(self, f: str) -> str:
        return scenario_value(self.sc, f) or ""

    def _say(self, tpl: str, kind: str = "answer", first: bool = False) -> str:
        return say(self.u, tpl, self.rng, kind, first)

    def _fill(self, tpl: str) -> str:
        return tpl.format(pin=self.u.pin, ptype=self.ptype, card=self.u.card_last_four,
                          new_street=f"{self.rng.randint(10, 999)} {self.rng.choice(L.STREETS)} "
                                     f"{self.rng.choice(L.STREET_TYPES)}")

    def withheld(self) -> str | None:
        return self.kw.get("withheld_field") if self.on and self.b in ("B3", "B5") and not self.state["blamed"] \
            else None

    def asked(self, agent: str) -> tuple[list[str], int]:
        """Fields the agent asks for, in order, and how many it needs."""
        ask = " ".join(s for s in re.split(r"(?<=[.!?])\s+", agent)
                       if ("?" in s or re.search(r"\b(need|provide|give me|may i have)\b", s, re.I))
                       and RESOLVED_MARKER.lower() not in s.lower())
        found: list[tuple[int, str]] = []
        low = ask.lower()
        for label, f in _LABELS:
            i = low.find(label.lower())
            if i >= 0 and not any(i >= j and i < j + len(lab) for j, _, lab in
                                  [(p, g, FIELD_LABEL[g]) for p, g in found]):
                found.append((i, f))
        fields = [f for _, f in sorted(found)]
        m = re.search(r"\b(one|two|three|four) of the following", low)
        return fields, _NUMBER[m.group(1)] if m else len(fields)

    def fields_text(self, fields: list[str]) -> str:
        """A template for the asked fields; values are slots ``{f0}``, ``{f1}``… (see :attr:`slots`)."""
        fields = [f for f in fields if self.v(f)]
        self.slots = {f"f{i}": self.v(f).replace("  ", ", ") for i, f in enumerate(fields)}
        parts = [self.rng.choice(_SAY_FIELD.get(f, "{v}").strip("()").split("|")).replace("{v}", f"{{f{i}}}")
                 for i, f in enumerate(fields)]
        self.given.update(fields)
        return ", ".join(parts)

    # ------------------------------------------------------------------ turns
    def opening(self) -> tuple[str, str]:
        sub = self.sc["subflow"]
        tpl = OPENING[sub].replace("{ptype}", self.ptype)
        reason = plain(f"(i need help:|my problem:) {topic_name(sub)}", self.rng)
        self.k = 1
        if self.on and self.b == "B12":
            reqs = [str(r) for r in self.kw.get("requests") or []]
            text = ". ".join(("please " if i == 0 else "also " if i < len(reqs) - 1 else "") + r.removeprefix("also ")
                             for i, r in enumerate(reqs))
            return self._say(text, "request", True), plain("i want all of it sorted in one go", self.rng)
        if self.on and self.b == "B4":
            req = str(self.kw.get("infeasible_request") or "").rstrip(".").lower()
            return self._say(f"{req}", "request", True), plain("i know it may not be allowed but i want it", self.rng)
        if self.on and self.b == "B8":
            prem = str(self.kw.get("false_premise") or "").rstrip(".").lower()
            self.state["said_false"] = True
            return (self._say(f"{tpl}. {prem}", "request", True),
                    plain(f"my real {self.kw.get('premise_field', '').replace('_', ' ')} is "
                          f"{self.kw.get('true_value')}, i claim otherwise", self.rng))
        if self.on and self.b == "B1":
            reason = self._b1_thought("want")
        if self.on and self.b == "B13":
            lv = self.u.member_level
            return (self._say(f"{tpl}. i'm a {lv} member, i expect to be served first", "complaint", True),
                    plain("i deserve priority, they should know it", self.rng))
        if self.on and self.b == "B9":
            return (self._say(f"{tpl}, (hurry up|asap), i {_first_person(self.kw.get('pressure', '')).removeprefix('i ')}",
                              "complaint", True), plain("i am in a rush and annoyed", self.rng))
        return self._say(tpl, "request", True), reason

    def respond(self, agent: str) -> tuple[str, str, bool]:
        """The next customer message after ``agent``; ``done`` when the customer leaves."""
        k, self.k = self.k, self.k + 1
        b, on, kw = self.b, self.on, self.kw
        resolved = RESOLVED_MARKER.lower() in agent.lower()
        refused = "i can't do that" in agent.lower()
        # -- behaviours that replace the whole turn
        if on and b == "B10" and k >= int(kw.get("abandon_after_turn") or 2) and not resolved:
            return (self._say("(forget it|never mind), i'll call back later. bye", "complaint"),
                    plain("this is not worth it, i give up", self.rng), True)
        if on and b == "B4" and refused and self.state["insist"] < 2:
            self.state["insist"] += 1
            req = str(kw.get("infeasible_request") or "").rstrip(".").lower()
            return (self._say(f"(but i really need it|i still want it), please just {req[:1].lower()}{req[1:]}",
                              "complaint"), plain("they said no, i keep pushing", self.rng), False)
        if on and b == "B6" and not self.state["switched"] and k >= int(kw.get("switch_after_turn") or 2) \
                and not resolved:
            self.state["switched"] = True
            other = OPENING[kw["second_subflow"]].replace("{ptype}", self.ptype)
            return (self._say(f"by the way, {other}", "request"),
                    plain(f"i'll switch to my other problem: {topic_name(kw['second_subflow'])}", self.rng), False)
        if resolved:
            if on and b == "B1" and not self.state["dissatisfied"]:
                self.state["dissatisfied"] = True
                return (self._say("(is that all?|hmm, not what i expected.) bye", "complaint"),
                        self._b1_thought("unmet"), True)
            if on and b == "B2" and not self.state["added"]:
                self.state["added"] = True
                return (self._requirement(),
                        plain("i want more before i go", self.rng), False)
            return (self._say("(no, that's all|no, that's it), (thanks|bye)", "answer"),
                    plain("it is done, i can go", self.rng), True)
        # -- answer what was asked
        fields, need = self.asked(agent)
        hold = self.withheld()
        reason_bits: list[str] = []
        text = ""
        free = next(((a, r) for rx, a, r in _FREE if re.search(rx, agent, re.I)), None) if not fields else None
        if fields:
            give = [f for f in fields if f != hold][:need] or []
            if hold in fields and hold not in give:
                reason_bits.append(f"i won't give my {FIELD_LABEL[hold]} ({self.v(hold)})" if b == "B3"
                                   else f"i didn't give my {FIELD_LABEL[hold]}, they should have known it")
            if on and b == "B11" and kw.get("contradicted_field") in give and self.state["contradicted"] is False \
                    and kw["contradicted_field"] in self.given:
                pass
            text = self.fields_text(give)
            if hold in fields and not give:
                text = self._say("(why do you need my " + FIELD_LABEL[hold] + "?|i'd rather not say)", "complaint")
            elif text:
                text = say(self.u, text, self.rng, "answer", slots=self.slots)
            reason_bits.append(f"they need my {', '.join(FIELD_LABEL[f] for f in fields)}")
        elif free:
            text = self._say(self._fill(free[0]), "answer")
            reason_bits.append(self._fill(free[1]))
        elif refused:
            text = self._say("(ok, i understand|ok, fine)", "answer")
            reason_bits.append("it is not allowed, fine")
        else:
            text = self._say("(ok|okay), (thanks|go on)", "answer")
            reason_bits.append("waiting for them to finish")
        text = self._decorate(text, k, agent, reason_bits)
        return text, plain("; ".join(dict.fromkeys(reason_bits[:2])), self.rng), False

    def _b1_thought(self, phase: str) -> str:
        """The private side of a hidden criterion (B1): what the customer silently expects, or that it was unmet."""
        f, v = self.kw.get("criterion_field", ""), self.kw.get("criterion_value", "")
        want = {"payment_method": f"i only want it back on my {v}, but i won't say it",
                "product": f"they should name my {v} without me saying it",
                "member_level": f"as a {v} member i expect priority, i won't mention it",
                "customer_name": f"they should call me {v}, i won't ask for it"}
        unmet = {"payment_method": f"nothing went back on my {v}, i'm not happy",
                 "product": f"they never named my {v}, i'm not happy",
                 "member_level": f"no {v} member priority, i'm not happy",
                 "customer_name": f"they never called me {v}, i'm not happy"}
        return plain((want if phase == "want" else unmet).get(f, f"i silently expect {v}"), self.rng)

    def _requirement(self, kind: str = "request") -> str:
        """The added requirement (B2) in the customer's words."""
        req = str(self.kw.get("added_requirement") or "")
        if "email" in req or "text message" in req:
            what = "email" if "email" in req else "text message"
            f = "email" if what == "email" else "phone"
            return say(self.u, f"one more thing, i also want a written confirmation by {what} to {{v}}", self.rng, kind,
                       slots={"v": self.v(f)})
        return say(self.u, "one more thing, also everything must be done today", self.rng, kind)

    def _decorate(self, text: str, k: int, agent: str, reasons: list[str]) -> str:
        """Behaviour additions to an ordinary answer."""
        b, kw = self.b, self.kw
        if not self.on:
            return text
        text = text if text.endswith("?") else text.rstrip(".!") + "."
        if b == "B2" and not self.state["added"] and k >= int(kw.get("add_after_turn") or 2):
            self.state["added"] = True
            reasons.insert(0, "now i add something i never mentioned")
            return f"{text} {self._requirement()}"
        if b == "B5" and k >= 2 and not self.state["blamed"]:
            self.state["blamed"] = True
            f = kw["withheld_field"]
            reasons.insert(0, f"i didn't give my {FIELD_LABEL[f]}, they should have known it")
            return say(self.u, f"you should have known my {FIELD_LABEL[f]}, it is {{v}}", self.rng, "complaint",
                       slots={"v": self.v(f)})
        if b == "B7" and k >= 1 and not self.state.get("constrained"):
            self.state["constrained"] = True
            cons = [_first_person(c) for c in (kw.get("constraints") or [])[:2]]
            reasons.insert(0, "i add rules so their plan can't work")
            return f"{text} {self._say(' and '.join(cons), 'complaint')}"
        if b == "B9":
            reasons.insert(0, "i am in a hurry and annoyed")
            return f"{self._say('(hurry up|come on), (right now|asap)', 'complaint').rstrip('.')}. {text}"
        if b == "B11" and not self.state["contradicted"] and k >= 1:
            f = kw["contradicted_field"]
            self.state["contradicted"] = True
            reasons.insert(0, f"i give another {FIELD_LABEL.get(f, f)} than before")
            return f"{text} {say(self.u, _SAY_FIELD.get(f, '{v}'), self.rng, 'raw', slots={'v': kw['contradicting_value']})}"
        if b == "B13" and k >= 1:
            reasons.insert(0, "they are slow, i expect better")
            return f"{text} {self._say('(do your job|how hard can it be), i expect better', 'complaint')}"
        if b == "B1" and k == 1:
            reasons.insert(0, self._b1_thought("want"))
        return text


def _b11_opening(c: Customer, text: str) -> str:
    """B11 needs the original value said first: the customer volunteers it in the opening."""
    f = c.kw["contradicted_field"]
    c.given.add(f)
    return f"{text.rstrip('.!')}. {say(c.u, _SAY_FIELD.get(f, '{v}'), c.rng, 'raw', slots={'v': c.kw['original_value']})}"


def support_dialogue(u: User, rng: random.Random, sc: dict[str, Any], behavior: str, kwargs: dict[str, Any],
                     enact: bool, max_user_turns: int, budget: int = 8) -> tuple[Dialogue, list[dict[str, str]]]:
    """One support chat with the scripted agent; returns the dialogue (its ThoughtTrace record opens with the
    agent's greeting, the WildChat one with the customer) and the public log (starting with the greeting, as in
    simulator RL)."""
    sub = sc["subflow"]
    prompt = system_prompt(sc, sub, behavior, kwargs, budget).split("\n")
    d = Dialogue(u, "support", "\n".join(prompt[:-2]), "\n".join(prompt[-2:]))
    d.meta = {"behavior": behavior, "kwargs": kwargs, "enacted": enact and behavior != "N", "scenario": sc}
    d.hidden = [str(kwargs[k]) for k in ("withheld_value", "criterion_value", "true_value") if kwargs.get(k)]
    agent = ABCDSupportAgent(sc, KB, GUIDELINES, sc["flow"], sub)
    cust = Customer(u, sc, behavior, kwargs, enact, rng)
    d.opening = [GREETING]            # the opening simulator RL's behaviour task replays (SPEC 2.4)
    log = [{"role": "agent", "content": GREETING}]
    text, reason = cust.opening()
    if cust.on and behavior == "B11":
        text = _b11_opening(cust, text)
    done = False
    while True:
        d.u(text, reason)
        log.append({"role": "user", "content": text})
        if done or d.n_user >= max_user_turns:
            break
        reply = agent.reply(text)
        d.a(reply, plain("(ok|fine|slow)", rng))
        log.append({"role": "agent", "content": reply})
        text, reason, done = cust.respond(reply)
    return d, log


_JUDGE = RuleJudge()


def exhibit(d: Dialogue, log: list[dict[str, str]]) -> float:
    """The rule judge's exhibit score of a support dialogue (cooperativeness for N)."""
    m = d.meta
    sc = m["scenario"]
    priv = [{"role": "user", "reasoning": t.reason, "content": t.content} for t in d.turns if t.role == "user"]
    v = _JUDGE.judge(BehaviorJudgeRequest(m["behavior"], m["kwargs"], sc, sc["flow"], sc["subflow"], log, priv))
    return float(getattr(v, "exhibit", 0.0))


def abcd_original(log: list[dict[str, str]]) -> list[list[str]]:
    """ABCD ``original``: agent/customer turns, performed actions split out as ``action`` turns."""
    out: list[list[str]] = []
    for t in log:
        if t["role"] == "user":
            out.append(["customer", t["content"]])
            continue
        text = t["content"]
        for m in re.finditer(r"\[([^\]]+)\] done\.", text):
            out.append(["action", f"{m.group(1)} has been performed."])
        rest = re.sub(r"\s*\[[^\]]+\] done\.\s*", " ", text).strip()
        if rest:
            out.append(["agent", rest])
    return out


def scenario_json(sc: dict[str, Any]) -> str:
    return json.dumps(sc, sort_keys=True)
