"""TauGym: retail customer-support tool use, tau-bench style (SPEC §3.1, DESIGN §5).

The agent is a retail support agent with a small database (``data/raw/gyms/tau/db.json``:
users, orders, products with variants). The customer is the user side (the simulator), told
the hidden goal in ``instruction``. Choices of ``interact_with_env``:

* ``action`` — call a tool; ``content`` is JSON ``{"name": <tool>, "arguments": {...}}``
  (``kwargs`` is accepted for ``arguments``; the arguments may also be a JSON string). The
  tool's output (JSON, or ``Error: …``) is the observation. A tool error is feedback, never an
  exception, and leaves the database untouched.
* ``answer`` — send a message to the customer (:meth:`Gym.ask_user`); the customer's reply is
  the observation. ``answer`` with content ``###DONE###`` ends the episode without a message.
* ``search`` — not available here (feedback, reward 0).

Episode end: the customer's reply contains ``###STOP###``, the agent sends ``###DONE###``, or
``max_steps`` steps were taken. Only then is the reward given: **1.0 iff the sha256 of the
canonical JSON (sorted keys) of the episode's final database equals that of a fresh copy of the
database after replaying the task's gold write ``actions``**, else 0.0 — the tau-bench
final-state check. Every other step has reward 0. Each episode works on its own deep copy of the
database (the loaded database is never mutated).

Task record (tau-bench format + an id): ``{id, user_id, instruction, actions: [{name, kwargs}],
outputs: [], opening?}`` — ``opening`` is the customer's first message, shown to the agent in
the row prompt.
"""
from __future__ import annotations

import copy
import hashlib
import json
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

from mimesis_lab.envs.gyms.base import CHOICES, Gym, StepResult, register_gym

__all__ = ["TauGym", "TOOLS", "WRITE_TOOLS", "ToolError", "DEFAULT_TASKS", "DEFAULT_DB", "load_tasks", "load_db",
           "build_rows", "db_hash", "call_tool", "STOP", "DONE"]

DATA_DIR = Path(__file__).resolve().parents[3] / "data" / "raw" / "gyms" / "tau"
DEFAULT_TASKS = DATA_DIR / "tasks.json"
DEFAULT_DB = DATA_DIR / "db.json"
STOP, DONE = "###STOP###", "###DONE###"
CANCEL_REASONS = ("no longer needed", "ordered by mistake")
ADDRESS_FIELDS = ("address1", "address2", "city", "state", "country", "zip")


class ToolError(Exception):
    """A tool refused the call (shown to the agent as ``Error: …``)."""


# --------------------------------------------------------------------------- tools
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
    if payment_method_id not in methods:
        raise ToolError(f"payment method {payment_method_id!r} does not belong to the order's user")
    return methods[payment_method_id]


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


def cancel_pending_order(db, order_id: str, reason: str):
    order = _order(db, order_id)
    if order["status"] != "pending":
        raise ToolError(f"order {order_id} is {order['status']}; only pending orders can be cancelled")
    if reason not in CANCEL_REASONS:
        raise ToolError(f"reason must be one of {list(CANCEL_REASONS)}")
    for pay in [p for p in order["payment_history"] if p["transaction_type"] == "payment"]:
        order["payment_history"].append({"transaction_type": "refund", "amount": pay["amount"],
                                         "payment_method_id": pay["payment_method_id"]})
        method = db["users"][order["user_id"]]["payment_methods"].get(pay["payment_method_id"], {})
        if method.get("source") == "gift_card":
            method["balance"] = round(method["balance"] + pay["amount"], 2)
    order["status"], order["cancel_reason"] = "cancelled", reason
    return order


def modify_pending_order_address(db, order_id: str, address1: str, address2: str, city: str, state: str,
                                 country: str, zip: str):  # noqa: A002
    order = _order(db, order_id)
    if order["status"] != "pending":
        raise ToolError(f"order {order_id} is {order['status']}; only pending orders can be modified")
    new = dict(address1=address1, address2=address2, city=city, state=state, country=country, zip=zip)
    if not all(isinstance(v, str) for v in new.values()) or not all(new[k].strip() for k in new if k != "address2"):
        raise ToolError("address1, city, state, country and zip must be non-empty strings (address2 may be empty)")
    order["address"] = {k: v.strip() for k, v in new.items()}
    return order


def return_delivered_order_items(db, order_id: str, item_ids: list, payment_method_id: str):
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError(f"order {order_id} is {order['status']}; only delivered orders can be returned")
    item_ids = _item_ids(item_ids)
    _check_items_in_order(order, item_ids)
    method = _payment(db, order, payment_method_id)
    original = {p["payment_method_id"] for p in order["payment_history"] if p["transaction_type"] == "payment"}
    if payment_method_id not in original and method.get("source") != "gift_card":
        raise ToolError("the refund must go to the original payment method or a gift card")
    order["status"] = "return requested"
    order["return_items"] = sorted(item_ids)
    order["return_payment_method_id"] = payment_method_id
    return order


def exchange_delivered_order_items(db, order_id: str, item_ids: list, new_item_ids: list, payment_method_id: str):
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError(f"order {order_id} is {order['status']}; only delivered orders can be exchanged")
    item_ids, new_item_ids = _item_ids(item_ids), _item_ids(new_item_ids, "new_item_ids")
    if len(item_ids) != len(new_item_ids):
        raise ToolError("item_ids and new_item_ids must have the same length")
    _check_items_in_order(order, item_ids)
    by_id = {it["item_id"]: it for it in order["items"]}
    diff = 0.0
    for old, new in zip(item_ids, new_item_ids):
        product = db["products"][by_id[old]["product_id"]]
        variant = product["variants"].get(new)
        if variant is None:
            raise ToolError(f"new item {new} is not a variant of {product['name']} (product {product['product_id']})")
        if new == old:
            raise ToolError(f"new item {new} is the same as the old item")
        if not variant["available"]:
            raise ToolError(f"new item {new} is not available")
        diff += variant["price"] - by_id[old]["price"]
    method = _payment(db, order, payment_method_id)
    diff = round(diff, 2)
    if method.get("source") == "gift_card" and method.get("balance", 0.0) < diff:
        raise ToolError("insufficient gift card balance to pay for the price difference")
    order["status"] = "exchange requested"
    order["exchange_items"], order["exchange_new_items"] = sorted(item_ids), sorted(new_item_ids)
    order["exchange_payment_method_id"], order["exchange_price_difference"] = payment_method_id, diff
    return order


TOOLS = {f.__name__: f for f in (find_user_id_by_email, find_user_id_by_name_zip, get_user_details,
                                   get_order_details, get_product_details, cancel_pending_order,
                                   modify_pending_order_address, return_delivered_order_items,
                                   exchange_delivered_order_items)}
WRITE_TOOLS = ("cancel_pending_order", "modify_pending_order_address", "return_delivered_order_items",
               "exchange_delivered_order_items")
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
    "exchange_delivered_order_items": "(order_id, item_ids, new_item_ids, payment_method_id) -> exchanges items "
                                      "of a *delivered* order for available variants of the same products",
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
    return hashlib.sha256(json.dumps(db, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@lru_cache(maxsize=8)
def _load_db_cached(path: str) -> dict:
    return json.loads(Path(path).read_text())


def load_db(path: str | Path = DEFAULT_DB) -> dict:
    """A fresh deep copy of the database at ``path``."""
    return copy.deepcopy(_load_db_cached(str(Path(path).resolve())))


def load_tasks(path: str | Path = DEFAULT_TASKS) -> dict[str, dict]:
    """Tasks by id; each gets ``db_path`` (the sibling ``db.json``) unless it names its own."""
    path = Path(path)
    raw = json.loads(path.read_text())
    out: dict[str, dict] = {}
    for t in raw:
        for k in ("id", "user_id", "instruction", "actions"):
            if k not in t:
                raise ValueError(f"{path}: tau task without {k!r}: {t}")
        t = dict(t)
        t.setdefault("outputs", [])
        t.setdefault("db_path", str(path.parent / "db.json"))
        out[str(t["id"])] = t
    return out


# --------------------------------------------------------------------------- rows
SYSTEM_PROMPT = """You are an agent that interacts with an environment through a tool. Below are the environment, your action space and some notes.

- Environment Description: TauGym is a retail customer-support desk. A customer has contacted you and wants help with their orders. You can look up and change the store's database with tools, and talk to the customer. The episode is judged by the final state of the database: it must be exactly what the customer's request requires, no more and no less.

- Action Space: call the tool `interact_with_env` with `choice` one of `action`, `answer`.

- Action Description:
  * `action`: call a store tool. `content` must be JSON: {"name": <tool name>, "arguments": {<argument>: <value>, ...}}. Tools:
TOOLS_HERE
  * `answer`: send a message to the customer in `content`; the customer's reply comes back. Send `###DONE###` as the content once the request is fully handled and nothing else is needed.

- Policy and Notes:
  * Authenticate the customer first (email, or first name + last name + zip code) and only act on that customer's orders.
  * Before any change (cancel, address change, return, exchange) state what you will do and get the customer's explicit confirmation. Never make changes the customer did not ask for.
  * A tool that refuses a call returns `Error: ...` and changes nothing.
  * Write your reasoning between `<think>` and `</think>` before each tool call. The number of steps is limited."""


def system_prompt() -> str:
    tools = "\n".join(f"    - {n}{TOOL_DOCS[n]}" for n in TOOLS)
    return SYSTEM_PROMPT.replace("TOOLS_HERE", tools)


def build_rows(tasks: dict[str, dict], split: str) -> list[dict]:
    rows = []
    for i, (tid, t) in enumerate(tasks.items()):
        opening = t.get("opening") or "Hi, I need some help with my order."
        user_msg = (f"A customer has started a chat with the support desk. Their first message:\n\"{opening}\"\n"
                    "Help the customer by talking to them (`answer`) and using the store tools (`action`).")
        rows.append(TauGym.userrl_row(tid, system_prompt(), user_msg, json.dumps(t["actions"], sort_keys=True),
                                      split, i))
    return rows


# --------------------------------------------------------------------------- gym
USER_PROMPT = """You are a customer of an online retail store, chatting with its support agent. Play this customer:

Instruction: {instruction}

You opened the chat with: "{opening}"

Rules:
- Write one short, natural message per turn, as a real customer would.
- Do not reveal the whole instruction at once; give details (email, order id, address...) only when they are needed or asked for.
- Never invent details that are not in the instruction; if asked something you do not know, say so.
- Confirm a proposed change only if it matches the instruction.
- When your request is fully handled (or cannot be handled), end with the message ###STOP### on its own."""


@register_gym
class TauGym(Gym):
    name = "tau"
    env_name = "TauGym"

    def setup(self) -> None:
        self._pristine = copy.deepcopy(self.task["db"]) if isinstance(self.task.get("db"), dict) else \
            load_db(self.task.get("db_path") or DEFAULT_DB)
        gold = copy.deepcopy(self._pristine)
        for a in self.task.get("actions", []):
            call_tool(gold, a["name"], dict(a.get("kwargs") or {}))  # a gold action that fails is a task bug
        self.gold_hash = db_hash(gold)

    def reset_state(self) -> str:
        self.db = copy.deepcopy(self._pristine)
        self.tool_calls: list[dict] = []
        return ""

    def final_reward(self) -> float:
        return 1.0 if db_hash(self.db) == self.gold_hash else 0.0

    def _end(self, observation: str, info: dict) -> StepResult:
        self.done = True
        reward = self.final_reward()
        info = dict(info, final_state_match=bool(reward), db_hash=db_hash(self.db), gold_hash=self.gold_hash)
        return StepResult(observation, reward, True, info)

    def step(self, choice: str, content: str) -> StepResult:
        if self.done:
            return StepResult("The episode has already ended.", 0.0, True, {"error": "episode_done"})
        self.steps += 1
        ch = choice.strip().strip("[]").lower() if isinstance(choice, str) else ""
        if ch == "action":
            obs, info = self._tool(content)
        elif ch == "answer":
            if not isinstance(content, str) or not content.strip():
                obs, info = "Error: `answer` needs a non-empty message for the customer.", {"error": "empty_message"}
            elif content.strip().upper() == DONE:
                return self._end("The conversation is closed.", {"ended_by": "agent"})
            else:
                reply = self.ask_user(content.strip())
                if STOP in reply:
                    text = reply.replace(STOP, "").strip()
                    obs = (f"Customer: {text}\n" if text else "") + "The customer has ended the conversation."
                    return self._end(obs, {"ended_by": "user"})
                obs, info = f"Customer: {reply}", {}
        elif ch == "search":
            obs, info = "Error: `search` is not available in TauGym; use `action` (tools) or `answer`.", \
                {"error": "unsupported_choice"}
        else:
            obs, info = (f"Error: unknown choice {choice!r}; use one of {list(CHOICES)} (`action` or `answer` here).",
                         {"error": "unknown_choice"})
        if self.steps >= self.max_steps:
            return self._end(obs + "\nThe maximum number of steps is reached; the episode ends.",
                             dict(info, ended_by="max_steps"))
        return StepResult(obs, 0.0, False, info)

    def _tool(self, content: Any) -> tuple[str, dict]:
        call = content
        if isinstance(content, str):
            try:
                call = json.loads(content)
            except json.JSONDecodeError:
                return ('Error: `action` content must be JSON {"name": <tool>, "arguments": {...}}.',
                        {"error": "malformed_json"})
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return 'Error: `action` content must be a JSON object with a "name" string.', {"error": "malformed_call"}
        args = call.get("arguments", call.get("kwargs", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                args = None
        name = call["name"]
        try:
            before = db_hash(self.db) if name in WRITE_TOOLS else None
            work = copy.deepcopy(self.db) if name in WRITE_TOOLS else self.db
            result = call_tool(work, name, args)
            if name in WRITE_TOOLS:
                self.db = work
        except ToolError as e:
            self.tool_calls.append({"name": name, "arguments": args, "error": str(e)})
            return f"Error: {e}", {"tool": name, "error": "tool_error", "detail": str(e)}
        self.tool_calls.append({"name": name, "arguments": args})
        info = {"tool": name}
        if before is not None:
            info["db_changed"] = before != db_hash(self.db)
        return json.dumps(result, sort_keys=True), info

    def user_system_prompt(self) -> str:
        return USER_PROMPT.format(instruction=self.task["instruction"],
                                  opening=self.task.get("opening") or "Hi, I need some help with my order.")

    def hidden_facts(self) -> list[str]:
        """Goal details of the gold actions (new address, cancel reason, returned items, exchange targets);
        order ids are not listed (the customer gives them)."""
        facts: list[str] = []
        for a in self.task.get("actions", []):
            kw = a.get("kwargs") or {}
            if a["name"] == "cancel_pending_order":
                facts.append(kw["reason"])
            elif a["name"] == "modify_pending_order_address":
                facts += [kw[k] for k in ("address1", "address2") if kw.get(k)]
                facts.append(f"{kw['city']}, {kw['state']} {kw['zip']}")
            elif a["name"] in ("return_delivered_order_items", "exchange_delivered_order_items"):
                order = self._pristine["orders"][kw["order_id"]]
                by_id = {it["item_id"]: it for it in order["items"]}
                if a["name"] == "return_delivered_order_items":
                    facts += [by_id[i]["name"] for i in kw["item_ids"] if i in by_id]
                for old, new in zip(kw.get("item_ids", []), kw.get("new_item_ids", [])):
                    product = self._pristine["products"][by_id[old]["product_id"]]
                    opts = product["variants"][new]["options"]
                    facts.append(f"{product['name']} ({', '.join(f'{k}: {v}' for k, v in opts.items())})")
                    facts += [f"{k}: {v}" for k, v in opts.items() if by_id[old]["options"].get(k) != v]
        return list(dict.fromkeys(f for f in facts if f))
