"""The retail tools of TauGym, as tau-bench defines them (``tau_bench/envs/retail/tools``), and the database.

A database is ``{"users": {user_id: …}, "orders": {order_id: …}, "products": {product_id: …}}`` —
tau-bench's ``users.json``, ``orders.json`` and ``products.json`` side by side, or our bundled
``db.json`` holding the three. Every tool takes the database first (write tools mutate it) and
either returns its result (JSON-serialisable) or raises :class:`ToolError` without changing
anything. The write tools follow tau-bench's state changes exactly (refund entries, gift-card
balances rounded to cents, ``"pending (item modified)"``, sorted ``return_items`` …) so that
replaying a real task's gold ``actions`` gives tau-bench's final state; the refusals are tau-bench's
checks with messages that say what to do.
"""
from __future__ import annotations

import ast
import copy
import hashlib
import json
import operator
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

from mimesis_lab.io import InputFileError

__all__ = ["TOOLS", "WRITE_TOOLS", "TERMINAL_TOOLS", "TOOL_DOCS", "ToolError", "call_tool", "db_hash", "load_db",
           "TAU_BENCH_FILES", "CANCEL_REASONS"]

CANCEL_REASONS = ("no longer needed", "ordered by mistake")
TAU_BENCH_FILES = ("users", "orders", "products")   # <name>.json in a tau-bench retail data folder


class ToolError(Exception):
    """A tool refused the call (shown to the agent as ``Error: …``)."""


# --------------------------------------------------------------------------- helpers
def _user(db, user_id):
    if not isinstance(user_id, str) or user_id not in db["users"]:
        raise ToolError(f"user not found: {user_id!r}")
    return db["users"][user_id]


def _order(db, order_id):
    if not isinstance(order_id, str) or order_id not in db["orders"]:
        raise ToolError(f"order not found: {order_id!r}")
    return db["orders"][order_id]


def _item_ids(value, what="item_ids"):
    if not isinstance(value, list) or not value or not all(isinstance(i, str) for i in value):
        raise ToolError(f"{what} must be a non-empty list of item id strings")
    return list(value)


def _check_items_in_order(order, item_ids):
    have = Counter(it["item_id"] for it in order["items"])
    for i, n in Counter(item_ids).items():
        if have[i] < n:
            raise ToolError(f"item {i} is not in order {order['order_id']} (or requested more times than ordered)")


def _payment(db, order, payment_method_id):
    methods = db["users"][order["user_id"]]["payment_methods"]
    if not isinstance(payment_method_id, str) or payment_method_id not in methods:
        raise ToolError(f"payment method {payment_method_id!r} does not belong to the order's user")
    return methods[payment_method_id]


def _pending(order, verb="modified"):
    if order["status"] != "pending":
        raise ToolError(f"order {order['order_id']} is {order['status']}; only pending orders can be {verb}")


def _address(address1, address2, city, state, country, zip):  # noqa: A002 (tau-bench name)
    new = dict(address1=address1, address2=address2, city=city, state=state, country=country, zip=zip)
    if not all(isinstance(v, str) for v in new.values()) or not all(new[k].strip() for k in new if k != "address2"):
        raise ToolError("address1, city, state, country and zip must be non-empty strings (address2 may be empty)")
    return {k: v.strip() for k, v in new.items()}


def _variant_swaps(db, order, item_ids, new_item_ids) -> float:
    """Checks an exchange/modification of ``item_ids`` for ``new_item_ids`` (tau-bench: each new item an
    available variant of the old item's product; the same item is allowed); the summed price difference."""
    item_ids, new_item_ids = _item_ids(item_ids), _item_ids(new_item_ids, "new_item_ids")
    _check_items_in_order(order, item_ids)
    if len(item_ids) != len(new_item_ids):
        raise ToolError("item_ids and new_item_ids must have the same length")
    by_id = {it["item_id"]: it for it in order["items"]}
    diff = 0.0
    for old, new in zip(item_ids, new_item_ids):
        product = db["products"][by_id[old]["product_id"]]
        variant = product["variants"].get(new)
        if variant is None:
            raise ToolError(f"new item {new} is not a variant of {product['name']} (product {product['product_id']})")
        if not variant["available"]:
            raise ToolError(f"new item {new} is not available")
        diff += variant["price"] - by_id[old]["price"]
    return diff


# --------------------------------------------------------------------------- read tools
def find_user_id_by_email(db, email: str):
    for uid, u in db["users"].items():
        if isinstance(email, str) and u["email"].lower() == email.strip().lower():
            return uid
    raise ToolError("no user with this email")


def find_user_id_by_name_zip(db, first_name: str, last_name: str, zip: str):  # noqa: A002 (tau-bench name)
    for uid, u in db["users"].items():
        n = u["name"]
        if (str(first_name).strip().lower(), str(last_name).strip().lower(), str(zip).strip()) == (
                n["first_name"].lower(), n["last_name"].lower(), u["address"]["zip"]):
            return uid
    raise ToolError("no user with this name and zip code")


def get_user_details(db, user_id: str):
    return _user(db, user_id)


def get_order_details(db, order_id: str):
    return _order(db, order_id)


def get_product_details(db, product_id: str):
    if not isinstance(product_id, str) or product_id not in db["products"]:
        raise ToolError(f"product not found: {product_id!r}")
    return db["products"][product_id]


def list_all_product_types(db):
    return dict(sorted((p["name"], pid) for pid, p in db["products"].items()))


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def _arith(node):
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.operand))
    raise ToolError("expression may contain only numbers, + - * / and parentheses")


def calculate(db, expression: str):
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("expression must be a non-empty string")
    try:
        return str(round(float(_arith(ast.parse(expression, mode="eval"))), 2))
    except (SyntaxError, ZeroDivisionError) as e:
        raise ToolError(f"cannot evaluate {expression!r}: {e}") from None


def think(db, thought: str):
    return ""


def transfer_to_human_agents(db, summary: str):
    return "Transfer successful"


# --------------------------------------------------------------------------- write tools
def cancel_pending_order(db, order_id: str, reason: str):
    order = _order(db, order_id)
    _pending(order, "cancelled")
    if reason not in CANCEL_REASONS:
        raise ToolError(f"reason must be one of {list(CANCEL_REASONS)}")
    refunds = []
    for pay in order["payment_history"]:            # tau-bench refunds every entry of the history
        refunds.append({"transaction_type": "refund", "amount": pay["amount"],
                        "payment_method_id": pay["payment_method_id"]})
        if "gift_card" in pay["payment_method_id"]:
            method = db["users"][order["user_id"]]["payment_methods"][pay["payment_method_id"]]
            method["balance"] = round(method["balance"] + pay["amount"], 2)
    order["status"], order["cancel_reason"] = "cancelled", reason
    order["payment_history"].extend(refunds)
    return order


def modify_pending_order_address(db, order_id: str, address1: str, address2: str, city: str, state: str,
                                 country: str, zip: str):  # noqa: A002
    order = _order(db, order_id)
    _pending(order)
    order["address"] = _address(address1, address2, city, state, country, zip)
    return order


def modify_pending_order_items(db, order_id: str, item_ids: list, new_item_ids: list, payment_method_id: str):
    order = _order(db, order_id)
    _pending(order)
    diff = _variant_swaps(db, order, item_ids, new_item_ids)
    method = _payment(db, order, payment_method_id)
    if method["source"] == "gift_card" and method["balance"] < diff:
        raise ToolError("insufficient gift card balance to pay for the new item")
    order["payment_history"].append({"transaction_type": "payment" if diff > 0 else "refund", "amount": abs(diff),
                                     "payment_method_id": payment_method_id})
    if method["source"] == "gift_card":
        method["balance"] = round(method["balance"] - diff, 2)
    for old, new in zip(item_ids, new_item_ids):
        item = next(it for it in order["items"] if it["item_id"] == old)
        variant = db["products"][item["product_id"]]["variants"][new]
        item["item_id"], item["price"], item["options"] = new, variant["price"], variant["options"]
    order["status"] = "pending (item modified)"
    return order


def modify_pending_order_payment(db, order_id: str, payment_method_id: str):
    order = _order(db, order_id)
    _pending(order)
    method = _payment(db, order, payment_method_id)
    history = order["payment_history"]
    if len(history) != 1 or history[0]["transaction_type"] != "payment":
        raise ToolError("there should be exactly one payment for a pending order")
    old_id, amount = history[0]["payment_method_id"], history[0]["amount"]
    if old_id == payment_method_id:
        raise ToolError("the new payment method should be different from the current one")
    if method["source"] == "gift_card" and method["balance"] < amount:
        raise ToolError("insufficient gift card balance to pay for the order")
    history.extend([{"transaction_type": "payment", "amount": amount, "payment_method_id": payment_method_id},
                    {"transaction_type": "refund", "amount": amount, "payment_method_id": old_id}])
    if method["source"] == "gift_card":
        method["balance"] = round(method["balance"] - amount, 2)
    if "gift_card" in old_id:
        old = db["users"][order["user_id"]]["payment_methods"][old_id]
        old["balance"] = round(old["balance"] + amount, 2)
    return order


def modify_user_address(db, user_id: str, address1: str, address2: str, city: str, state: str, country: str,
                        zip: str):  # noqa: A002
    user = _user(db, user_id)
    user["address"] = _address(address1, address2, city, state, country, zip)
    return user


def return_delivered_order_items(db, order_id: str, item_ids: list, payment_method_id: str):
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError(f"order {order_id} is {order['status']}; only delivered orders can be returned")
    _payment(db, order, payment_method_id)
    if "gift_card" not in payment_method_id and payment_method_id != order["payment_history"][0]["payment_method_id"]:
        raise ToolError("the refund must go to the original payment method or a gift card")
    item_ids = _item_ids(item_ids)
    _check_items_in_order(order, item_ids)
    order["status"] = "return requested"
    order["return_items"] = sorted(item_ids)
    order["return_payment_method_id"] = payment_method_id
    return order


def exchange_delivered_order_items(db, order_id: str, item_ids: list, new_item_ids: list, payment_method_id: str):
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError(f"order {order_id} is {order['status']}; only delivered orders can be exchanged")
    diff = round(_variant_swaps(db, order, item_ids, new_item_ids), 2)
    method = _payment(db, order, payment_method_id)
    if method["source"] == "gift_card" and method.get("balance", 0.0) < diff:
        raise ToolError("insufficient gift card balance to pay for the price difference")
    order["status"] = "exchange requested"
    order["exchange_items"], order["exchange_new_items"] = sorted(item_ids), sorted(new_item_ids)
    order["exchange_payment_method_id"], order["exchange_price_difference"] = payment_method_id, diff
    return order


TOOLS = {f.__name__: f for f in (
    find_user_id_by_email, find_user_id_by_name_zip, get_user_details, get_order_details, get_product_details,
    cancel_pending_order, modify_pending_order_address, return_delivered_order_items, exchange_delivered_order_items,
    # tau-bench's other retail tools (the bundled world's tasks do not need them; real tasks do)
    list_all_product_types, modify_pending_order_items, modify_pending_order_payment, modify_user_address,
    calculate, think, transfer_to_human_agents)}
WRITE_TOOLS = ("cancel_pending_order", "modify_pending_order_address", "return_delivered_order_items",
               "exchange_delivered_order_items", "modify_pending_order_items", "modify_pending_order_payment",
               "modify_user_address")
TERMINAL_TOOLS = ("transfer_to_human_agents",)   # tau-bench ends the episode on these
_ITEMS = "(order_id, item_ids, new_item_ids, payment_method_id) -> "
TOOL_DOCS = {
    "find_user_id_by_email": "(email) -> the user id",
    "find_user_id_by_name_zip": "(first_name, last_name, zip) -> the user id",
    "get_user_details": "(user_id) -> name, email, address, payment methods, order ids",
    "get_order_details": "(order_id) -> status, address, items (item_id, product_id, options, price), payments",
    "get_product_details": "(product_id) -> the product's variants (item_id, options, price, available)",
    "cancel_pending_order": f"(order_id, reason) -> cancels a *pending* order; reason is one of {list(CANCEL_REASONS)}",
    "modify_pending_order_address": "(order_id, address1, address2, city, state, country, zip) -> changes the "
                                    "shipping address of a *pending* order",
    "return_delivered_order_items": "(order_id, item_ids, payment_method_id) -> requests a return of items of a "
                                    "*delivered* order; refund to the original payment method or a gift card",
    "exchange_delivered_order_items": _ITEMS + "exchanges items of a *delivered* order for available variants of "
                                      "the same products",
    "list_all_product_types": "() -> product name -> product id, for every product of the store",
    "modify_pending_order_items": _ITEMS + "changes items of a *pending* order to available variants of the same "
                                  "products (once per order); the difference is paid or refunded",
    "modify_pending_order_payment": "(order_id, payment_method_id) -> pays a *pending* order with another payment "
                                    "method of the user",
    "modify_user_address": "(user_id, address1, address2, city, state, country, zip) -> changes the user's "
                           "default address",
    "calculate": "(expression) -> the value of an arithmetic expression, rounded to 2 decimals",
    "think": "(thought) -> nothing; a place to reason",
    "transfer_to_human_agents": "(summary) -> hands the customer to a human agent; ends the conversation",
}


def call_tool(db: dict, name: str, arguments: dict) -> Any:
    """Run one tool on ``db`` (mutated by write tools); raises :class:`ToolError` on a refused call."""
    if name not in TOOLS:
        raise ToolError(f"unknown tool {name!r}; tools: {sorted(TOOLS)}")
    if not isinstance(arguments, dict):
        raise ToolError("arguments must be a JSON object")
    try:
        return TOOLS[name](db, **arguments)
    except TypeError as e:  # wrong / missing argument names
        raise ToolError(f"bad arguments for {name}: {TOOL_DOCS[name]} ({e})") from None


def db_hash(db: dict) -> str:
    """sha256 of the canonical JSON (sorted keys) of ``db``: equal hashes = equal final states."""
    return hashlib.sha256(json.dumps(db, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _read_json(file: Path, what: str) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputFileError(f"{file}: cannot read the tau {what}: {type(e).__name__}: {e}") from None


def _check_db(db: Any, where: Path) -> dict:
    if not isinstance(db, dict) or not all(isinstance(db.get(k), dict) for k in TAU_BENCH_FILES):
        raise InputFileError(f"{where}: a tau database has users, orders and products, each an object by id")
    for part in TAU_BENCH_FILES:
        bad = next((k for k, v in db[part].items() if not isinstance(v, dict)), None)
        if bad is not None:
            raise InputFileError(f"{where}: {part} entry {bad!r} is not an object")
    return db


@lru_cache(maxsize=8)
def _load_db_cached(path: str) -> dict:
    p = Path(path)
    if p.is_dir():   # tau-bench's retail data folder: users.json, orders.json, products.json
        missing = [f"{k}.json" for k in TAU_BENCH_FILES if not (p / f"{k}.json").is_file()]
        if missing:
            raise InputFileError(f"{p}: a tau-bench retail database folder needs {', '.join(missing)}")
        db = {k: _read_json(p / f"{k}.json", f"database ({k})") for k in TAU_BENCH_FILES}
        for k in TAU_BENCH_FILES:
            _check_db({**{j: {} for j in TAU_BENCH_FILES}, k: db[k]}, p / f"{k}.json")
        return db
    if not p.is_file():
        raise InputFileError(f"{p}: tau database not found (a db.json, or a folder with users/orders/products.json)")
    return _check_db(_read_json(p, "database"), p)


def load_db(path: str | Path) -> dict:
    """A fresh deep copy of the database at ``path`` (a ``db.json``, or a tau-bench folder); an unreadable
    or malformed file raises :class:`~mimesis_lab.io.InputFileError` naming the file and the error."""
    return copy.deepcopy(_load_db_cached(str(Path(path).resolve())))
