"""TauGym: retail customer-support tool use, tau-bench style (SPEC §3.1, DESIGN §5).

The agent is a retail support agent with a database: by default our bundled one
(``data/raw/gyms/tau/db.json``, or the ``db.json`` beside the task file), or tau-bench's retail
database (a folder with ``users.json``, ``orders.json``, ``products.json``; ``gyms.tau_db``), on which
UserRL's real tau tasks act. The tools are tau-bench's retail tools (:mod:`.tau_tools`). The
customer is the user side (the simulator), told the hidden goal in ``instruction``.

Choices of ``interact_with_env`` (our tasks; DESIGN §5):

* ``action`` — call a tool; ``content`` is JSON ``{"name": <tool>, "arguments": {...}}``
  (``kwargs`` is accepted for ``arguments``; the arguments may also be a JSON string). The
  tool's output (JSON, or ``Error: …``) is the observation. A tool error is feedback, never an
  exception, and leaves the database untouched.
* ``answer`` — send a message to the customer (:meth:`Gym.ask_user`); the customer's reply is
  the observation. ``answer`` with content ``###DONE###`` ends the episode without a message.
* ``search`` — not available here (feedback, reward 0).

UserRL's tasks (records ``{id, obs, info: {task: {user_id, actions, instruction, outputs}}}``) keep
UserRL's own mapping, which its row prompts teach (``protocol: "userrl"``): ``action`` talks to the
customer, ``answer`` calls a tool, ``search`` with ``tools`` lists the tools (``help``: how to play).

Episode end: the customer's reply contains ``###STOP###``, the agent sends ``###DONE###``, the
agent calls ``transfer_to_human_agents``, or ``max_steps`` steps were taken. Only then is the
reward given, as tau-bench computes it: **1.0 iff the sha256 of the canonical JSON (sorted keys) of
the episode's final database equals that of a fresh copy of the database after replaying the
task's gold ``actions``** and every string of the task's ``outputs`` occurs (lower-cased, commas
removed) in a message the agent sent to the customer; else 0.0. Every other step has reward 0.
Each episode works on its own deep copy of the database (the loaded database is never mutated).

Task record (tau-bench format + an id): ``{id, user_id, instruction, actions: [{name, kwargs}],
outputs: [], opening?}`` — ``opening`` is the customer's first message, shown to the agent in
the row prompt.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from mimesis_lab.envs.gyms.base import (CHOICES, Gym, StepResult, check_finite, check_id, check_strings,
                                        register_gym, task_records)
from mimesis_lab.envs.gyms.tau_tools import (CANCEL_REASONS, TERMINAL_TOOLS, TOOL_DOCS, TOOLS, WRITE_TOOLS,
                                             ToolError, call_tool, db_hash)
from mimesis_lab.envs.gyms.tau_tools import load_db as _load_db_at

__all__ = ["TauGym", "TOOLS", "WRITE_TOOLS", "ToolError", "DEFAULT_TASKS", "DEFAULT_DB", "load_tasks", "load_db",
           "build_rows", "db_hash", "call_tool", "STOP", "DONE", "WORLD_TOOLS", "userrl_task", "outputs_found",
           "CANCEL_REASONS", "TERMINAL_TOOLS", "tool_list", "check_task"]

DATA_DIR = Path(__file__).resolve().parents[3] / "data" / "raw" / "gyms" / "tau"
DEFAULT_TASKS = DATA_DIR / "tasks.json"
DEFAULT_DB = DATA_DIR / "db.json"
STOP, DONE = "###STOP###", "###DONE###"
ADDRESS_FIELDS = ("address1", "address2", "city", "state", "country", "zip")
# the tools our own tasks' prompt lists (the bundled world's tasks need no others; all of TOOLS can be called)
WORLD_TOOLS = ("find_user_id_by_email", "find_user_id_by_name_zip", "get_user_details", "get_order_details",
               "get_product_details", "cancel_pending_order", "modify_pending_order_address",
               "return_delivered_order_items", "exchange_delivered_order_items")
DEFAULT_OPENING = "Hi, I need some help with my order."


def load_db(path: str | Path = DEFAULT_DB) -> dict:
    """A fresh deep copy of the database at ``path``: a ``db.json`` or tau-bench's retail data folder
    (``users.json``, ``orders.json``, ``products.json``). A missing, unreadable or malformed file raises
    :class:`~mimesis_lab.io.InputFileError` naming the file and the error."""
    return _load_db_at(path)


def userrl_task(rec: dict[str, Any]) -> dict[str, Any]:
    """Our task record from one of UserRL's TauGym task records (``{id, obs, info: {task: {...}}}``);
    other records are returned as they are. A nested record lacking a field raises ``ValueError`` naming it."""
    info = rec.get("info")
    if not (isinstance(info, dict) and isinstance(info.get("task"), dict)):
        return rec
    inner = info["task"]
    missing = [k for k in ("user_id", "actions", "instruction") if k not in inner]
    if missing:
        raise ValueError(f"tau task {rec.get('id')!r}: info.task has no {', '.join(map(repr, missing))}")
    out = {"id": rec.get("id"), "user_id": inner["user_id"], "instruction": inner["instruction"],
           "actions": inner["actions"], "outputs": list(inner.get("outputs") or []), "protocol": "userrl"}
    if rec.get("obs"):
        out["opening"] = rec["obs"]
    return out


def load_tasks(path: str | Path = DEFAULT_TASKS, db: str | Path | None = None) -> dict[str, dict]:
    """Tasks by id, in our format or UserRL's (nested under ``info.task``: :func:`userrl_task`).

    Each task gets ``db_path``: ``db`` when given (``gyms.tau_db``: a tau-bench retail folder or a
    ``db.json``; it is read here, so a broken database fails naming its file), else the path the
    record names, else the sibling ``db.json``.
    """
    path = Path(path)
    if db is not None:
        load_db(db)
    raw = task_records(json.loads(path.read_text()), path, "tau")
    out: dict[str, dict] = {}
    for t in raw:
        if not isinstance(t, dict):
            raise ValueError(f"{path}: a tau task is a JSON object, not {t!r:.60}")
        try:
            t = dict(userrl_task(t))
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        for k in ("id", "user_id", "instruction", "actions"):
            if t.get(k) is None:
                raise ValueError(f"{path}: tau task without {k!r}: {t!r:.200}")
        t.setdefault("outputs", [])
        try:
            check_task(t)
        except ValueError as e:
            raise ValueError(f"{path}: malformed tau task {str(t['id'])!r}: {e}") from None
        if db is not None:
            t["db_path"] = str(db)
        else:
            t.setdefault("db_path", str(path.parent / "db.json"))
        out[str(t["id"])] = t
    return out


def check_task(t: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the field when a task cannot be played: ``id``, ``user_id`` and
    ``instruction`` non-empty strings (an integer id is fine), ``actions`` a list (may be empty) of
    ``{name: <a tool of TOOLS>, kwargs: {...}}``, ``outputs`` a list of strings or numbers, ``opening`` (if
    any) a string, and no NaN or infinite number anywhere. Whether the gold actions succeed depends on the
    database: a failing one is reported when the episode is built (:meth:`TauGym.setup`)."""
    check_id(t)
    check_strings(t, ("user_id", "instruction"), ("opening",) if t.get("opening") is not None else ())
    acts = t["actions"]
    if not isinstance(acts, list):
        raise ValueError(f"field 'actions' must be a list of {{name, kwargs}} tool calls, got "
                         f"{type(acts).__name__} {acts!r:.40}")
    for n, a in enumerate(acts):
        if not isinstance(a, dict):
            raise ValueError(f"actions[{n}] must be a {{name, kwargs}} object, got {a!r:.40}")
        if not isinstance(a.get("name"), str) or a["name"] not in TOOLS:
            raise ValueError(f"actions[{n}]: field 'name' {a.get('name')!r:.40} is not a tool (tools: {sorted(TOOLS)})")
        if a.get("kwargs") is not None and not isinstance(a["kwargs"], dict):
            raise ValueError(f"actions[{n}]: field 'kwargs' must be an object, got {a['kwargs']!r:.40}")
    outs = t["outputs"]
    if not isinstance(outs, list) or not all(isinstance(o, (str, int, float)) and not isinstance(o, bool)
                                             for o in outs):
        raise ValueError(f"field 'outputs' must be a list of strings, got {outs!r:.60}")
    check_finite(t)


def outputs_found(outputs: list[str], messages: list[str]) -> dict[str, bool]:
    """tau-bench's output check: each required output, lower-cased, occurs in a message to the customer
    (lower-cased, commas removed)."""
    said = [m.lower().replace(",", "") for m in messages]
    return {o: any(str(o).lower() in m for m in said) for o in outputs}


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


USERRL_SYSTEM_PROMPT = """You are an agent that interacts with an environment through a tool. Below are the environment, your action space and some notes.

- Environment Description: TauGym is a retail customer-support desk. A customer wants help with their orders. Find out what they need by talking to them, and fulfil it with the store's internal tools; the episode is judged by the final state of the store's database.

- Action Space: call the tool `interact_with_env` with `choice` one of `search`, `action`, `answer`.

- Action Description:
  * `search`: `content` is `tools` (the list of internal tools with their arguments) or `help` (how to work here).
  * `action`: send a message to the customer in `content`; the customer's reply comes back.
  * `answer`: call an internal tool; `content` must be JSON: {"name": <tool name>, "arguments": {<argument>: <value>, ...}}.

- Policy and Notes:
  * Authenticate the customer first (email, or first name + last name + zip code) and only act on that customer's orders.
  * Before any change state what you will do and get the customer's explicit confirmation. Never make changes the customer did not ask for.
  * A tool that refuses a call returns `Error: ...` and changes nothing.
  * Write your reasoning between `<think>` and `</think>` before each tool call. The number of steps is limited."""
USERRL_HELP = ("Ask the customer what they need and how to identify them (`action`), look their account and orders "
               "up with the tools (`answer` with a JSON tool call), confirm each change with the customer, then "
               "make it. The conversation ends when the customer is satisfied.")


def tool_list(names=None) -> str:
    """One line per tool: its name, arguments and what it does."""
    return "\n".join(f"    - {n}{TOOL_DOCS[n]}" for n in (names or TOOLS))


def system_prompt() -> str:
    """The system prompt of our tasks' rows (lists :data:`WORLD_TOOLS`, as before tau-bench's other tools)."""
    return SYSTEM_PROMPT.replace("TOOLS_HERE", tool_list(WORLD_TOOLS))


def build_rows(tasks: dict[str, dict], split: str) -> list[dict]:
    rows = []
    for i, (tid, t) in enumerate(tasks.items()):
        opening = t.get("opening") or DEFAULT_OPENING
        if t.get("protocol") == "userrl":
            system = USERRL_SYSTEM_PROMPT
            user_msg = (f"Here is my request: {opening}\nHelp me step by step: talk to me (`action`) and call the "
                        "internal tools (`answer`).")
        else:
            system = system_prompt()
            user_msg = (f"A customer has started a chat with the support desk. Their first message:\n\"{opening}\"\n"
                        "Help the customer by talking to them (`answer`) and using the store tools (`action`).")
        rows.append(TauGym.userrl_row(tid, system, user_msg, json.dumps(t["actions"], sort_keys=True), split, i))
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
        for n, a in enumerate(self.task.get("actions", []), 1):   # a gold action that fails is a task bug
            try:
                call_tool(gold, a["name"], dict(a.get("kwargs") or {}))
            except ToolError as e:
                where = "the given db" if isinstance(self.task.get("db"), dict) else \
                    (self.task.get("db_path") or DEFAULT_DB)
                raise ToolError(f"tau task {self.task.get('id')!r}: gold action {n} ({a['name']}) fails on the "
                                f"database {where}: {e} (is gyms.tau_db the database of these tasks?)") from None
        self.gold_hash = db_hash(gold)
        self.userrl = self.task.get("protocol") == "userrl"

    def reset_state(self) -> str:
        self.db = copy.deepcopy(self._pristine)
        self.tool_calls: list[dict] = []
        return ""

    def final_reward(self) -> float:
        """tau-bench's reward: the final state equals the gold one and every required output was said."""
        if db_hash(self.db) != self.gold_hash:
            return 0.0
        return 1.0 if all(self.outputs_check().values()) else 0.0

    def outputs_check(self) -> dict[str, bool]:
        return outputs_found(self.task.get("outputs") or [],
                             [m["content"] for m in self.dialogue if m["role"] == "agent"])

    def _end(self, observation: str, info: dict) -> StepResult:
        self.done = True
        reward = self.final_reward()
        info = dict(info, final_state_match=db_hash(self.db) == self.gold_hash, db_hash=db_hash(self.db),
                    gold_hash=self.gold_hash)
        if self.task.get("outputs"):
            info["outputs_found"] = self.outputs_check()
        return StepResult(observation, reward, True, info)

    def step(self, choice: str, content: str) -> StepResult:
        if self.done:
            return StepResult("The episode has already ended.", 0.0, True, {"error": "episode_done"})
        self.steps += 1
        ch = choice.strip().strip("[]").lower() if isinstance(choice, str) else ""
        tool_choice, talk_choice = ("answer", "action") if self.userrl else ("action", "answer")
        if ch == tool_choice:
            obs, info = self._tool(content)
            if info.get("tool") in TERMINAL_TOOLS and "error" not in info:
                return self._end(f"{obs}\nThe customer has been transferred; the conversation ends.",
                                 dict(info, ended_by="transfer"))
        elif ch == talk_choice:
            if not isinstance(content, str) or not content.strip():
                obs, info = f"Error: `{talk_choice}` needs a non-empty message for the customer.", \
                    {"error": "empty_message"}
            elif content.strip().upper() == DONE:
                return self._end("The conversation is closed.", {"ended_by": "agent"})
            else:
                reply = self.ask_user(content.strip())
                if STOP in reply:
                    text = reply.replace(STOP, "").strip()
                    obs = (f"Customer: {text}\n" if text else "") + "The customer has ended the conversation."
                    return self._end(obs, {"ended_by": "user"})
                obs, info = f"Customer: {reply}", {}
        elif ch == "search" and self.userrl:
            what = content.strip().lower() if isinstance(content, str) else ""
            if what == "tools":
                obs, info = "Internal tools (call one with `answer`):\n" + tool_list(), {"search": "tools"}
            elif what == "help":
                obs, info = USERRL_HELP, {"search": "help"}
            else:
                obs, info = "Error: `search` content must be `tools` or `help`.", {"error": "bad_search"}
        elif ch == "search":
            obs, info = "Error: `search` is not available in TauGym; use `action` (tools) or `answer`.", \
                {"error": "unsupported_choice"}
        else:
            obs, info = (f"Error: unknown choice {choice!r}; use one of {list(CHOICES)} (`{tool_choice}` or "
                         f"`{talk_choice}` here).", {"error": "unknown_choice"})
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
                return (f'Error: `{"answer" if self.userrl else "action"}` content must be JSON '
                        '{"name": <tool>, "arguments": {...}}.',
                        {"error": "malformed_json"})
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return (f'Error: `{"answer" if self.userrl else "action"}` content must be a JSON object with a "name" '
                    'string.', {"error": "malformed_call"})
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
                                  opening=self.task.get("opening") or DEFAULT_OPENING)

    def hidden_facts(self) -> list[str]:
        """Goal details of the gold actions (new address, cancel reason, returned items, exchange targets);
        order ids are not listed (the customer gives them)."""
        facts: list[str] = []
        for a in self.task.get("actions", []):
            kw = a.get("kwargs") or {}
            if a["name"] == "cancel_pending_order":
                facts.append(kw["reason"])
            elif a["name"] in ("modify_pending_order_address", "modify_user_address"):
                facts += [kw[k] for k in ("address1", "address2") if kw.get(k)]
                facts.append(f"{kw['city']}, {kw['state']} {kw['zip']}")
            elif a["name"] in ("return_delivered_order_items", "exchange_delivered_order_items",
                               "modify_pending_order_items"):
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
