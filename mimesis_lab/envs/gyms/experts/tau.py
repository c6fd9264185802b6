"""TauGym expert: a retail support agent that verifies the customer, asks what they need, looks the
orders up, confirms its plan and calls the store tools.

The customer's goal is theirs (the agent is shown only their opening message), so the expert talks
to them (``answer`` turns):

1. ask for their email (or name and zip code) and find their user id; read their account
   (``get_user_details``: payment methods, orders);
2. ask what they need; the reply names the orders and what to do with each. :func:`plan_request`
   reads it, one order at a time: cancel (with the reason they give), change the shipping address
   (the address they give), return items (the items they name, not those they keep, refunded to the
   payment method they name or else the original one) or exchange items (for the variant of the same
   product whose options they name), with a fall-back they state ("if that variant is not available,
   return it instead"); on a pending order also change the payment method or modify items. tau-bench's
   own instructions ("For #W1504875, exchange Notebook {'size': 'A6', …} to {'size': 'A5'}; via
   paypal_6262583.") name the new options after ``to`` (``to {}``: the same item) and the payment
   method by its id;
3. look every order (and, for an exchange, the product) up, and check the plan against what the
   tools say: a cancel of an order that is no longer pending, or an exchange for an unavailable
   variant, takes the stated fall-back, or is explained to the customer, whose answer ("in that
   case, I'd like to return it instead…") is planned the same way (at most two such follow-ups);
4. state the plan and ask for confirmation; on ``yes`` call the write tools, then tell the customer
   it is done (the customer ends the conversation), or close with ``###DONE###``.

On UserRL's own rows the prompt teaches UserRL's mapping of the choices (``answer`` calls a tool,
``action`` talks to the customer); the expert reads it from the prompt (:func:`userrl_protocol`).

An uninformative reply gets the question once more (the request and a confirmation up to twice
more, a confirmation not after a no). Exploring, it may look up every order of the
account before asking, or confirm each change separately.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Generator

from mimesis_lab.envs.gyms.experts.base import Action, Expert
from mimesis_lab.envs.gyms.text import words

__all__ = ["TauExpert", "Step", "userrl_protocol", "plan_request", "parse_address", "pick_payment", "pick_variant"]

_ORDER = re.compile(r"#W\d+")
_INTENTS = (("exchange", r"\b(exchange|swap)"), ("return", r"\b(return|send (it|them|something) back)"),
            ("cancel", r"\bcancel"), ("payment", r"\bchange (the )?payment\b"), ("modify", r"\bmodify\b"),
            ("address", r"\b(ship(ped)? to|deliver(ed)? to|should go to|send it to|shipping address|address)\b"))
_ADDRESS = re.compile(r"(\d+ [A-Z][\w .]*?),\s*(?:((?:Apt|Suite|Floor|Unit)[^,]*),\s*)?([A-Z][\w .]*?),\s*"
                      r"([A-Z]{2}) (\d{5})(?:,\s*([A-Za-z .]+?))?[.;]?(?:\s|$)")
_YES = re.compile(r"^\s*(yes|yeah|sure|ok|okay|please do|go ahead)\b", re.IGNORECASE)
_NO = re.compile(r"^\s*(no|nope|don't)\b", re.IGNORECASE)


@dataclass
class Step:
    """One change the customer asked for: ``kind`` (cancel / address / return / exchange) on ``order``,
    with what the text says about it; ``fallback`` = "return" when they stated one."""

    kind: str
    order: str
    text: str
    fallback: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        a = self.arguments
        if self.kind == "cancel":
            return f"cancel order {self.order} (reason: {a['reason']})"
        if self.kind == "address":
            return (f"ship order {self.order} to {a['address1']}, {a['address2'] + ', ' if a['address2'] else ''}"
                    f"{a['city']}, {a['state']} {a['zip']}, {a['country']}")
        if self.kind == "payment":
            return f"pay order {self.order} with {a['payment_method_id']} instead"
        if self.kind == "modify":
            return (f"change items {', '.join(a['item_ids'])} of pending order {self.order} to "
                    f"{', '.join(a['new_item_ids'])}, any difference paid with {a['payment_method_id']}")
        if self.kind == "return":
            return (f"return items {', '.join(a['item_ids'])} of order {self.order}, "
                    f"refunded to {a['payment_method_id']}")
        return (f"exchange items {', '.join(a['item_ids'])} of order {self.order} for {', '.join(a['new_item_ids'])}, "
                f"any difference paid with {a['payment_method_id']}")

    def call(self) -> str:
        name = {"cancel": "cancel_pending_order", "address": "modify_pending_order_address",
                "payment": "modify_pending_order_payment", "modify": "modify_pending_order_items",
                "return": "return_delivered_order_items", "exchange": "exchange_delivered_order_items"}[self.kind]
        return json.dumps({"name": name, "arguments": {"order_id": self.order, **self.arguments}})


def plan_request(text: str, default_order: str | None = None) -> list[Step]:
    """The changes a customer's message asks for, one per order it names (module docstring); a
    message that names no order is about ``default_order`` (the one under discussion)."""
    sents = re.split(r"(?<=[.!?])\s+", text.strip())
    segments: list[tuple[str, str]] = []
    lead = ""      # what comes before the first order ("I moved to 984 Hill Ln, …") belongs to it
    for s in sents:
        ids = _ORDER.findall(s)
        if ids:
            segments.append((ids[0], (lead + " " + s).strip() if not segments else s))
        elif segments:
            segments[-1] = (segments[-1][0], segments[-1][1] + " " + s)
        else:
            lead += " " + s
    if not segments and default_order:
        segments = [(default_order, text)]
    steps = []
    for order, seg in segments:
        found = sorted((m.start(), kind) for kind, rx in _INTENTS for m in [re.search(rx, seg, re.IGNORECASE)] if m)
        found = [(at, k) for at, k in found if not re.search(r"\bnot (a|an|to)\s*$", seg[:at], re.IGNORECASE)]
        if not found:
            continue
        kind = found[0][1]
        fallback = "return" if kind != "return" and re.search(r"\breturn\b[^.]*\binstead\b", seg, re.IGNORECASE) \
            else None
        steps.append(Step(kind, order, seg, fallback))
    return steps


def parse_address(text: str, country: str | None = None) -> dict[str, str] | None:
    """The postal address in ``text`` ("450 Pine Street, Apt 12, Seattle, WA 98109, USA"); a customer
    who names no country means their own (``country``, from their account), else ``None``."""
    m = _ADDRESS.search(text)
    if m is None or not (m.group(6) or country):
        return None
    return {"address1": m.group(1).strip(), "address2": (m.group(2) or "").strip(), "city": m.group(3).strip(),
            "state": m.group(4), "country": (m.group(6) or country or "").strip(), "zip": m.group(5)}


def pick_payment(text: str, methods: dict[str, dict[str, Any]], default: str | None) -> str | None:
    """The payment method the text names first (brand, last four digits, gift card, PayPal; "credit
    card" only when nothing more specific is named), skipping negated mentions ("not the credit card")."""
    low = text.lower()
    best: tuple[int, int, str] | None = None
    for mid, m in methods.items():
        cues = [(str(mid), -1)]     # the method's id ("via credit_card_4190576": tau-bench's instructions)
        cues += [(c, 0) for c in (m.get("brand"), m.get("last_four")) if c]
        cues += [("gift card", 0)] if m.get("source") == "gift_card" else []
        cues += [("paypal", 0)] if m.get("source") == "paypal" else []
        cues += [("credit card", 1)] if m.get("source") == "credit_card" else []
        for cue, weak in cues:
            for hit in re.finditer(rf"\b{re.escape(str(cue).lower())}\b", low):
                if re.search(r"\bnot (the |my |your )?$", low[max(0, hit.start() - 12):hit.start()]):
                    continue
                key = (weak, hit.start(), mid)
                best = key if best is None or key < best else best
    return best[2] if best else default


def _value_named(value: str, text: str) -> bool:
    vw = words(value)
    if (len(value) <= 2 and value.isalpha()) or not vw:   # "L", "A5": too short for words()
        return re.search(rf"(?<![A-Za-z0-9]){re.escape(value)}(?![A-Za-z0-9])", text) is not None
    return vw <= words(text)


def pick_variant(product: dict[str, Any], old_item: str, text: str) -> str | None:
    """The variant of ``product`` (not ``old_item``) whose option values ``text`` names most; among
    those, the one that keeps most of the old item's other options ("the black one" of a size L shirt
    is the black shirt in size L)."""
    variants = product.get("variants", {})
    old = (variants.get(old_item) or {}).get("options", {})
    scored = []
    for vid, v in variants.items():
        if vid == old_item:
            continue
        named = sum(_value_named(str(val), text) for val in v["options"].values())
        kept = sum(old.get(k) == val for k, val in v["options"].items())
        scored.append((named, kept, vid))
    scored.sort(key=lambda s: (-s[0], -s[1], s[2]))
    return scored[0][2] if scored and scored[0][0] > 0 else None


def _items_named(order: dict[str, Any], text: str) -> list[dict[str, Any]]:
    if re.search(r"\b(everything|entire|whole order|all (the )?items)\b", text, re.IGNORECASE):
        return list(order["items"])
    kept = re.sub(r"\bkeep\b[^.;]*", " ", text, flags=re.IGNORECASE)
    tw = words(kept)
    hits = [it for it in order["items"] if len(words(it["name"]) & tw) * 2 >= max(1, len(words(it["name"])))]
    return hits or (list(order["items"]) if len(order["items"]) == 1 else [])


_SPEC = re.compile(r"([A-Z][\w' -]*?)\s*\{[^{}]*\}\s*to\s*(\{[^{}]*\})")


def _option_changes(text: str) -> dict[str, str]:
    """Item name -> the options it should change to, as tau-bench's instructions state them
    ("exchange Notebook {'size': 'A6', …} to {'size': 'A5'}": the options named after ``to``)."""
    return {m.group(1).strip(): m.group(2) for m in _SPEC.finditer(text)}


def _json(obs: str) -> Any:
    try:
        return json.loads(obs)
    except (json.JSONDecodeError, TypeError):
        return None


def _tool(name: str, **arguments: Any) -> Action:
    return ("action", json.dumps({"name": name, "arguments": arguments}))


def userrl_protocol(view_prompt: str) -> bool:
    """Whether the row's prompt teaches UserRL's mapping of the choices (``answer`` calls a tool,
    ``action`` talks to the customer) rather than ours: its ``answer`` description mentions a tool."""
    m = re.search(r"\*\s*`answer`\s*:([^\n]*)", view_prompt)
    return bool(m and re.search(r"\btool\b", m.group(1), re.IGNORECASE))


class TauExpert(Expert):
    gym = "tau"

    def act(self, observation: str | None) -> Action | None:
        """The policy's actions in our mapping (``action`` = tool, ``answer`` = customer), swapped when the
        prompt teaches UserRL's (:func:`userrl_protocol`: UserRL's own tau rows)."""
        action = super().act(observation)
        if action is None or not self._userrl:
            return action
        return ({"action": "answer", "answer": "action"}.get(action[0], action[0]), action[1])

    @property
    def _userrl(self) -> bool:
        if not hasattr(self, "_userrl_cached"):
            self._userrl_cached = userrl_protocol("\n".join(c for r, c in self.view.prompt if r == "system"))
        return self._userrl_cached

    def policy(self) -> Generator[Action, str, None]:
        # 1. who is it?
        user_id = None
        for ask in ("Hello! I'm happy to help. First, could you please verify your identity with your email "
                    "address (or your first name, last name and zip code)?",
                    "Sorry, I still need to verify your account: what is your email address, or your name and "
                    "zip code?"):
            reply = yield ("answer", ask)
            email = re.search(r"[\w.+-]+@[\w-]+\.[\w.-]+", reply)
            name = re.search(r"\bI'm ([A-Z][a-z]+) ([A-Z][a-z]+)\b", reply)
            zip_ = re.search(r"\b(\d{5})\b", reply)
            if email:
                obs = yield _tool("find_user_id_by_email", email=email.group(0).rstrip("."))
            elif name and zip_:
                obs = yield _tool("find_user_id_by_name_zip", first_name=name.group(1), last_name=name.group(2),
                                  zip=zip_.group(1))
            else:
                continue
            user_id = _json(obs) if not obs.startswith("Error") else None
            if isinstance(user_id, str):
                break
        if not isinstance(user_id, str):
            yield ("answer", "###DONE###")
            return
        user = _json((yield _tool("get_user_details", user_id=user_id))) or {}
        methods = user.get("payment_methods") or {}
        orders: dict[str, dict[str, Any]] = {}
        if self.coin(0.3):   # exploring: read every order of the account first
            for oid in user.get("orders", []):
                orders[oid] = _json((yield _tool("get_order_details", order_id=oid))) or {}
        # 2. what do they need?
        first = (user.get("name") or {}).get("first_name", "")
        steps: list[Step] = []
        for ask in (f"Thank you{', ' + first if first else ''}, your account is verified. How can I help you today?",
                    "Could you tell me which order it is about (the order number) and what you would like done?",
                    "Sorry, I didn't catch that: which order is it, and what should I do with it?"):
            reply = yield ("answer", ask)
            if "has ended the conversation" in reply:
                return
            steps = plan_request(_said(reply))
            if steps:
                break
        done: list[Step] = []
        for _ in range(3):     # a request, then at most two follow-ups after something could not be done
            if not steps:
                break
            # 3. look it up and check the plan against the store
            plan: list[Step] = []
            refusals: list[str] = []
            for st in steps:
                if st.order not in orders:
                    orders[st.order] = _json((yield _tool("get_order_details", order_id=st.order))) or {}
                step, why = yield from self._check(st, orders[st.order], methods)
                if step is not None:
                    plan.append(step)
                else:
                    refusals.append(why)
            # 4. confirm and act
            if plan:
                groups = [[s] for s in plan] if self.coin(0.3) else [plan]
                for group in groups:
                    what = " and ".join(s.describe() for s in group)
                    reply = yield ("answer", f"To confirm, I will {what}. Shall I proceed?")
                    asks = 1
                    while not _YES.search(_said(reply)):   # asked again while the reply is unclear, not after a no
                        if asks >= 3 or _NO.search(_said(reply)):
                            yield ("answer", "###DONE###")
                            return
                        reply = yield ("answer", f"Just to be sure: shall I {what}? Please answer yes or no.")
                        asks += 1
                    for s in group:
                        yield ("action", s.call())
                    done += group
            if not refusals:
                break
            reply = yield ("answer", "I'm sorry: " + "; ".join(refusals) + ". What would you like me to do instead?")
            if "has ended the conversation" in reply:
                return
            steps = plan_request(_said(reply), default_order=steps[-1].order)
        if not done:
            yield ("answer", "###DONE###")
            return
        reply = yield ("answer", "All done: " + " and ".join(s.describe() for s in done)
                       + ". Is there anything else I can help you with?")
        if "has ended the conversation" not in reply:
            yield ("answer", "###DONE###")

    def _check(self, st: Step, order: dict[str, Any], methods: dict[str, Any]
               ) -> Generator[Action, str, tuple[Step | None, str]]:
        """``st`` made concrete against the store (its arguments filled in), or ``(None, why not)``;
        an exchange looks the product up first."""
        status = order.get("status", "")
        original = next((p["payment_method_id"] for p in order.get("payment_history", [])
                         if p.get("transaction_type") == "payment"), None)
        kind = st.kind
        if kind == "cancel" and status != "pending":
            if not (st.fallback and status == "delivered"):
                return None, f"order {st.order} is {status or 'not found'}, so it can no longer be cancelled"
            kind = st.fallback
        if kind in ("address", "payment", "modify") and status != "pending":
            return None, f"order {st.order} is {status or 'not found'}, so it can no longer be changed"
        if kind == "payment":
            pay = pick_payment(st.text, methods, None)
            if pay is None or pay == original:
                return None, f"I could not tell which other payment method to use for order {st.order}"
            st.arguments = {"payment_method_id": pay}
            return st, ""
        if kind == "modify":   # tau-bench: "modify Item {old} to {new}"; "to {}" keeps the item as it is
            specs = _option_changes(st.text)
            items = [it for it in order.get("items", []) if it["name"] in specs]
            new_ids = []
            for it in items:
                if specs[it["name"]].strip("{} ") == "":
                    new_ids.append(it["item_id"])
                    continue
                product = _json((yield _tool("get_product_details", product_id=it["product_id"]))) or {}
                vid = pick_variant(product, it["item_id"], specs[it["name"]])
                if not (vid and product["variants"][vid].get("available")):
                    return None, f"the {it['name']} you asked for is not available"
                new_ids.append(vid)
            if not items:
                return None, f"I could not tell which items of order {st.order} to change"
            st.arguments = {"item_ids": [it["item_id"] for it in items], "new_item_ids": new_ids,
                            "payment_method_id": pick_payment(st.text.split("}")[-1], methods, original)}
            return st, ""
        if kind == "exchange":
            specs = _option_changes(st.text)    # "Grill {…} to {…}": the items are those named before a spec
            items = [it for it in order.get("items", []) if it["name"] in specs] or \
                _items_named(order, st.text.split(" for the ")[0])
            target = st.text.split(" for the ", 1)[1].split(".")[0] if " for the " in st.text else st.text
            new_ids, missing = [], []
            for it in items:
                if specs.get(it["name"], "x").strip("{} ") == "":   # "Item {…} to {}": the same item again
                    new_ids.append(it["item_id"])
                    continue
                product = _json((yield _tool("get_product_details", product_id=it["product_id"]))) or {}
                vid = pick_variant(product, it["item_id"], specs.get(it["name"], target))
                if vid and product["variants"][vid].get("available"):
                    new_ids.append(vid)
                else:
                    missing.append(f"the {it['name']} you asked for is not available")
            if items and not missing:
                st.arguments = {"item_ids": [it["item_id"] for it in items], "new_item_ids": new_ids,
                                "payment_method_id": pick_payment(st.text, methods, original)}
                return st, ""
            if st.fallback is None:
                return None, "; ".join(missing) or f"I could not tell which items of order {st.order} to exchange"
            kind = st.fallback
        step = Step(kind, st.order, st.text)
        if kind == "cancel":
            reason = "ordered by mistake" if re.search(r"\b(by mistake|by accident|accidentally|wrong)\b", st.text,
                                                       re.IGNORECASE) else "no longer needed"
            step.arguments = {"reason": reason}
        elif kind == "address":
            addr = parse_address(st.text, (order.get("address") or {}).get("country"))
            if addr is None:
                return None, f"I could not read the new address for order {st.order}"
            step.arguments = addr
        else:   # return
            text = re.split(r"\bif\b", st.text, flags=re.IGNORECASE)[-1] if st.kind != "return" else st.text
            items = _items_named(order, text) or _items_named(order, st.text)
            if not items:
                return None, f"I could not tell which items of order {st.order} to return"
            if status != "delivered":
                return None, f"order {st.order} is {status or 'not found'}, so it cannot be returned"
            step.arguments = {"item_ids": [it["item_id"] for it in items],
                              "payment_method_id": pick_payment(text, methods, original)}
        return step, ""


def _said(reply: str) -> str:
    """The customer's words in a reply observation."""
    return reply.removeprefix("Customer:").strip()
