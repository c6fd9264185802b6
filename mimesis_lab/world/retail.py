"""Retail domain (TauGym): the store database of the population and tau-bench style tasks and chats.

Each tau user is a world user (name, email, address, card). A task's goal follows from the
user's traits: an exchange goes to the variant in their favourite colour, a cancellation gives
their usual reason, an address change moves the order to their new street. The opening message
is public and names the kind of request ("i'd like a different colour for my hoodie"); the
detail that decides the final database state (which colour, which reason) stays in the
instruction, i.e. with the user.
"""
from __future__ import annotations

import copy
import json
import random
from typing import Any

from mimesis_lab.envs.gyms.tau import STOP, call_tool
from mimesis_lab.world import lexicon as L
from mimesis_lab.world.population import User
from mimesis_lab.world.style import Dialogue, plain, say

__all__ = ["build_products", "build_db", "tau_tasks", "retail_dialogue", "tau_user_id"]


def build_products() -> dict[str, Any]:
    """Every combination of options is a variant; a few are out of stock (deterministic)."""
    products: dict[str, Any] = {}
    for k, (name, opts) in enumerate(L.TAU_PRODUCTS.items()):
        pid = f"10{k + 1:02d}"
        combos: list[dict[str, str]] = [{}]
        for key, vals in opts.items():
            combos = [dict(c, **{key: v}) for c in combos for v in vals]
        variants = {}
        for j, c in enumerate(combos):
            iid = f"2{k + 1:02d}{j + 1:02d}"
            price = L.TAU_BASE_PRICE[name] + (2 * j % 5)
            variants[iid] = {"item_id": iid, "options": c, "price": float(price), "available": (k + j) % 7 != 3}
        products[pid] = {"product_id": pid, "name": name, "variants": variants}
    return products


def tau_user_id(u: User) -> str:
    return f"{u.first}_{u.last}_{u.zip_code[-4:]}"


def _address(u: User, street: str | None = None) -> dict[str, str]:
    return {"address1": (street or u.street).title(), "address2": "", "city": u.town.title(),
            "state": u.state.upper(), "country": "USA", "zip": u.zip_code}


def build_db(users: list[User], rng: random.Random) -> dict[str, Any]:
    """Users (with a credit card and, by trait, a gift card or paypal) and 3 orders each: one
    pending, two delivered, items drawn from the catalogue."""
    products = build_products()
    db: dict[str, Any] = {"users": {}, "orders": {}, "products": products}
    n = 1000
    for u in users:
        uid = tau_user_id(u)
        pm = {f"credit_card_{u.card_last_four}": {"source": "credit_card", "brand": "visa",
                                                   "last_four": u.card_last_four, "id": f"credit_card_{u.card_last_four}"}}
        if u.payment_method == "gift card":
            pm[f"gift_card_{u.pin}"] = {"source": "gift_card", "balance": 50.0, "id": f"gift_card_{u.pin}"}
        elif u.payment_method == "paypal":
            pm[f"paypal_{u.pin}"] = {"source": "paypal", "id": f"paypal_{u.pin}"}
        orders = []
        for status in ("pending", "delivered", "delivered"):
            n += 1
            oid = f"#W{n}"
            items = []
            for pid in rng.sample(sorted(products), rng.choice((1, 2))):
                iid = rng.choice(sorted(v for v, x in products[pid]["variants"].items() if x["available"]))
                var = products[pid]["variants"][iid]
                items.append({"item_id": iid, "product_id": pid, "name": products[pid]["name"],
                              "options": dict(var["options"]), "price": var["price"]})
            card = f"credit_card_{u.card_last_four}"
            db["orders"][oid] = {"order_id": oid, "user_id": uid, "address": _address(u), "items": items,
                                 "status": status, "payment_history": [
                                     {"transaction_type": "payment", "amount": round(sum(i["price"] for i in items), 2),
                                      "payment_method_id": card}]}
            orders.append(oid)
        db["users"][uid] = {"user_id": uid, "name": {"first_name": u.first.title(), "last_name": u.last.title()},
                            "email": u.email, "address": _address(u), "payment_methods": pm, "orders": orders}
    return db


def _opts(o: dict[str, str]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in o.items())


def _task(u: User, db: dict[str, Any], rng: random.Random, kind: str) -> dict[str, Any] | None:
    uid = tau_user_id(u)
    user = db["users"][uid]
    pending, delivered = user["orders"][0], user["orders"][1:]
    who = f"You are {u.first.title()} {u.last.title()} (email {u.email})."
    card = f"credit_card_{u.card_last_four}"
    if kind == "cancel":
        reason = "ordered by mistake" if u.patience <= 3 else "no longer needed"
        names = " and ".join(i["name"] for i in db["orders"][pending]["items"])
        return {"instruction": f"{who} You want to cancel your pending order {pending} (the {names}) because it was "
                               f"{reason}. If asked for a reason, say {reason}. You do not want anything else.",
                "opening": "(i want to cancel an order|please cancel one of my orders)",
                "actions": [{"name": "cancel_pending_order", "kwargs": {"order_id": pending, "reason": reason}}],
                "goal": f"cancel {pending}, reason: {reason}", "detail": reason}
    if kind == "address":
        street = f"{rng.randint(10, 999)} {rng.choice(L.STREETS)} {rng.choice(L.STREET_TYPES)}"
        a = _address(u, street)
        return {"instruction": f"{who} You moved to {a['address1']}, {a['city']}, {a['state']} {a['zip']}. You want the "
                               f"shipping address of your pending order {pending} changed to it. You do not want "
                               "anything else.",
                "opening": "(i moved and need to change the address on my order|can you change the address of an order?)",
                "actions": [{"name": "modify_pending_order_address", "kwargs": {"order_id": pending, **a}}],
                "goal": f"move {pending} to {a['address1']}", "detail": a["address1"]}
    oid = rng.choice(delivered)
    order = db["orders"][oid]
    if kind == "exchange":
        for it in order["items"]:
            prod = db["products"][it["product_id"]]
            if "color" not in it["options"] or it["options"]["color"] == u.colour:
                continue
            want = dict(it["options"], color=u.colour)
            new = next((v for v, x in prod["variants"].items() if x["options"] == want and x["available"]), None)
            if new is None:
                continue
            return {"instruction": f"{who} You want to exchange the {it['name']} ({_opts(it['options'])}) from your "
                                   f"delivered order {oid} for the {u.colour} one, because {u.colour} is your favourite "
                                   "colour. Pay any difference with your credit card. You do not want anything else.",
                    "opening": f"(i'd like a different colour for my {it['name']}|can i swap my {it['name']} for "
                               "another colour?)",
                    "actions": [{"name": "exchange_delivered_order_items", "kwargs": {
                        "order_id": oid, "item_ids": [it["item_id"]], "new_item_ids": [new], "payment_method_id": card}}],
                    "goal": f"exchange the {it['name']} for the {u.colour} one", "detail": u.colour}
        return None
    it = rng.choice(order["items"])
    return {"instruction": f"{who} You want to return the {it['name']} ({_opts(it['options'])}) from your delivered "
                           f"order {oid} and get the refund on your credit card. You do not want anything else.",
            "opening": "(i want to return something from my last order|how do i return an item?)",
            "actions": [{"name": "return_delivered_order_items", "kwargs": {
                "order_id": oid, "item_ids": [it["item_id"]], "payment_method_id": card}}],
            "goal": f"return the {it['name']} from {oid}", "detail": it["name"]}


def tau_tasks(users: list[User], db: dict[str, Any], rng: random.Random, n: int, seed: int = 0
              ) -> list[dict[str, Any]]:
    """``n`` tasks, kinds in turn (exchange, return, cancel, address); every gold action is checked to apply."""
    kinds = ("exchange", "return", "cancel", "address")
    tasks: list[dict[str, Any]] = []
    i = 0
    while len(tasks) < n and i < 20 * n:
        u = users[i % len(users)]
        t = _task(u, db, rng, kinds[i % len(kinds)])
        i += 1
        if t is None:
            continue
        gold = copy.deepcopy(db)
        for a in t["actions"]:
            call_tool(gold, a["name"], dict(a["kwargs"]))
        k = len(tasks) + 1
        tasks.append({"id": f"tau-w{seed}-{k:03d}", "user_id": tau_user_id(u), "world_user": u.uid,
                      "opening": say(u, t["opening"], rng, "request", first=True), "instruction": t["instruction"],
                      "actions": t["actions"], "outputs": []})
    return tasks


def retail_dialogue(u: User, rng: random.Random, task: dict[str, Any], db: dict[str, Any]) -> Dialogue:
    """A tau-bench style chat with a scripted support agent that authenticates, asks, confirms and acts."""
    d = Dialogue(u, "retail", "You are a customer of an online retail store, chatting with its support agent.",
                 f"Instruction: {task['instruction']} When your request is fully handled, end with ###STOP###.")
    a = task["actions"][0]
    kw = a["kwargs"]
    detail = {"cancel_pending_order": kw.get("reason"), "modify_pending_order_address": kw.get("address1"),
              "exchange_delivered_order_items": u.colour, "return_delivered_order_items": None}[a["name"]]
    d.hidden = [x for x in (detail,) if x]
    d.meta = {"task": task["id"]}
    d.u(task["opening"], plain(f"i want this done: {a['name'].replace('_', ' ')}", rng))
    d.a(plain("(sure.|i can help.) (what is your email?|can you give me your email?)", rng))
    d.u(say(u, "(it's {v}|my email is {v})", rng, "answer", slots={"v": u.email}),
        plain("they need my email to find me", rng))
    d.a(plain("(thanks.|found you.) which order is it about?", rng))
    oid = kw["order_id"]
    extra = {"cancel_pending_order": "", "return_delivered_order_items": "",
             "modify_pending_order_address": "", "exchange_delivered_order_items": f", i want the {u.colour} one"}
    withhold = a["name"] == "exchange_delivered_order_items" and rng.random() > u.openness
    d.u(say(u, f"(order {{v}}|it's order {{v}}){'' if withhold else extra[a['name']]}", rng, "answer",
            slots={"v": oid}),
        plain(f"it is {oid}" + (f". i want {u.colour}, my favourite, but i'll wait" if withhold else ""), rng))
    if a["name"] == "cancel_pending_order":
        d.a(plain("why do you want to cancel it?", rng))
        d.u(say(u, f"it was {kw['reason']}", rng, "answer"), plain(f"my reason: {kw['reason']}", rng))
    elif a["name"] == "modify_pending_order_address":
        d.a(plain("what is the new address?", rng))
        d.u(say(u, "{v}", rng, "answer", slots={"v": f"{kw['address1']}, {kw['city']} {kw['zip']}"}),
            plain("i moved, this is my new street", rng))
    elif withhold:
        d.a(plain("which colour would you like instead?", rng))
        d.u(say(u, f"(the {u.colour} one|{u.colour} please)", rng, "answer"),
            plain(f"{u.colour} is my favourite colour", rng))
    d.a(plain(f"i will {a['name'].replace('_', ' ')} for order {oid}. (shall i go ahead?|is that right?)", rng))
    d.u(say(u, "(yes, go ahead|yes please)", rng, "answer"), plain("that matches what i want", rng))
    d.a(plain("(done.|it is done.) anything else?", rng))
    d.u(say(u, "(no thanks|no, that's all)", rng, "answer") + f" {STOP}", plain("all handled, i end the chat", rng))
    return d


def db_json(db: dict[str, Any]) -> str:
    return json.dumps(db, indent=1, sort_keys=True)
