"""FunctionGym (SPEC §3.1, DESIGN §5): guess a hidden rule over four integers, then solve its test case.

Task file format = the real UserRL ``functions.json`` (a list; also ``{id: record}`` or
``{"tasks": [...]}``)::

    {"id": "func-1", "rule": "c * (a * b) * d", "test_case": [3, 5, 5, 3], "expected_result": 225.0}

Rules use the names ``a b c d``, numbers, ``+ - * /``, powers ``**`` (squaring; the real file also
has e.g. ``d ** a``) and unary ``±``; they are evaluated by :func:`safe_eval`, which walks the
``ast`` and rejects everything else (calls, attributes, subscripts, other names…) — never ``eval``.

**Reward rule** (no user side; FunctionGym is not episode-scoped for CSD):

* ``action`` (content = four integers separated by spaces or commas): returns the rule's output
  on them; reward 0. Inputs the rule is undefined on (division by zero, overflow) get feedback.
* ``search`` (content = ``test``): returns the test case and marks it retrieved; reward 0. Any
  other search content is feedback.
* ``answer`` (content = one number): **1.0** and done if the test case was retrieved before and
  ``|x - expected| <= 1e-6 * max(1, |expected|)``; otherwise reward 0 and not done (answers may
  be given several times).

Unknown choices and malformed content are feedback (reward 0, not done); each call counts as a
step and the episode ends after ``max_steps`` steps.

**A task must be playable and reward only the right answer** (:func:`check_task`, run by
:func:`load_tasks`): ``test_case`` is a list of four integers (not booleans, strings or floats),
``expected_result`` a finite number, and the rule evaluated on the test case gives the expected
result (within the answer tolerance). A record that fails is an error naming the field.
"""
from __future__ import annotations

import ast
import json
import math
import operator
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

from mimesis_lab.envs.gyms.base import Gym, StepResult, check_finite, check_id, register_gym, task_records

__all__ = ["TASKS_PATH", "FunctionGym", "RuleError", "safe_eval", "load_tasks", "build_rows", "format_number",
           "check_task"]

TASKS_PATH = Path(__file__).resolve().parents[3] / "data" / "raw" / "gyms" / "function" / "tasks.json"

VARS = ("a", "b", "c", "d")
MAX_INPUT = 10 ** 9
MAX_BITS = 4096
MAX_RULE_CHARS = 500
REL_TOL = 1e-6

SYSTEM_PROMPT = (
    "You are an agent that interacts with an environment to discover a hidden rule. The environment and "
    "your action space are described below.\n\n"
    "- Environment Description: FunctionGym is a function-guessing game. A hidden function maps four "
    "numbers a, b, c, d to one output using only addition, subtraction, multiplication, division and "
    "squaring. Probe it with inputs of your choice, infer the rule, then apply it to the test case.\n\n"
    "- Action Space: call the tool `interact_with_env` with a `choice` of `action`, `search` or `answer` "
    "and a `content` string.\n\n"
    "- Action Description:\n"
    "  * `action`: write four integers separated by spaces in `content` (e.g. `1 2 3 4`); the "
    "environment returns the function's output for them.\n"
    "  * `search`: write exactly `test` in `content` to retrieve the test case. Nothing else can be "
    "searched.\n"
    "  * `answer`: write a single number in `content`: the hidden function applied to the test case. "
    "Retrieve the test case first; you may answer more than once.\n\n"
    "- Important Notes:\n"
    "  * First reason about your next step between `<think>` and `</think>`, then call the tool.\n"
    "  * The number of interaction rounds is limited, so probe efficiently: start with small numbers and "
    "change one input at a time to isolate its effect. The function may combine the inputs in any "
    "order (e.g. use c before a).\n"
    "  * Be systematic, bold and smart. Let's begin!"
)
USER_MESSAGE = "I have fixed a hidden function of four numbers. Start probing it whenever you are ready!"


class RuleError(ValueError):
    """A rule that is not allowed (unsafe syntax) or cannot be evaluated on these inputs."""


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: None, ast.Pow: None}


def _pow(base, exp):
    """``base ** exp`` with guards: results beyond ``MAX_BITS`` bits / float range raise :class:`RuleError`."""
    if isinstance(exp, float) and exp.is_integer() and abs(exp) < 2 ** 63:
        exp = int(exp)
    if isinstance(exp, int):
        if base == 1:
            return base
        if base == 0:
            if exp < 0:
                raise RuleError("zero to a negative power")
            return base if exp > 0 else 1
        if base == -1:
            return 1 if exp % 2 == 0 else -1
        if isinstance(base, int) and exp >= 0:
            if base.bit_length() * exp > MAX_BITS:
                raise RuleError("result too large")
            return base ** exp
    try:
        return math.pow(base, exp)
    except (OverflowError, ValueError, ZeroDivisionError) as e:
        raise RuleError(f"cannot compute {base} ** {exp}: {e}") from None


def _eval(node: ast.AST, env: dict[str, int | float]):
    if isinstance(node, ast.Expression):
        return _eval(node.body, env)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise RuleError(f"unknown name {node.id!r}")
        return env[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand, env)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left, env), _eval(node.right, env)
        if isinstance(node.op, ast.Div):
            if right == 0:
                raise RuleError("division by zero")
            return left / right
        if isinstance(node.op, ast.Pow):
            return _pow(left, right)
        return _BINOPS[type(node.op)](left, right)
    raise RuleError(f"disallowed syntax: {type(node).__name__}")


def safe_eval(rule: str, values: dict[str, int | float] | list | tuple) -> float:
    """Evaluate ``rule`` on ``values`` (``{a,b,c,d}`` or a 4-sequence) with only + - * / ** and ±.

    Raises :class:`RuleError` for anything else (names other than a-d, calls, attributes…) or when
    the value is undefined (division by zero, overflow, non-finite)."""
    if not isinstance(rule, str) or not rule.strip() or len(rule) > MAX_RULE_CHARS:
        raise RuleError("rule must be a non-empty string of at most 500 characters")
    if isinstance(values, (list, tuple)):
        if len(values) != 4:
            raise RuleError("need exactly four values")
        values = dict(zip(VARS, values))
    env = {k: values[k] for k in VARS if k in values}
    try:
        tree = ast.parse(rule.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise RuleError(f"cannot parse rule: {e}") from None
    try:
        out = _eval(tree, env)
    except (OverflowError, RecursionError) as e:
        raise RuleError(f"cannot evaluate rule: {e}") from None
    try:
        out = float(out)
    except OverflowError:
        raise RuleError("result too large") from None
    if not math.isfinite(out):
        raise RuleError("result is not finite")
    return out


def format_number(x: float) -> str:
    """An output for the agent: ``225.0`` → ``"225.0"``; non-integers rounded to 6 decimals."""
    x = float(x)
    if x.is_integer() and abs(x) < 1e15:
        return f"{x:.1f}"
    return repr(round(x, 6))


def load_tasks(path: str | Path = TASKS_PATH) -> dict[str, dict[str, Any]]:
    """Tasks by id from the UserRL ``functions.json`` format (list), ``{id: record}`` or ``{"tasks": [...]}``."""
    data = task_records(json.loads(Path(path).read_text(encoding="utf-8")), path, "function")
    tasks: dict[str, dict[str, Any]] = {}
    for rec in data:
        if not isinstance(rec, dict):
            raise ValueError(f"{path}: malformed function task (not an object): {rec!r:.80}")
        missing = [k for k in ("id", "rule", "test_case", "expected_result") if k not in rec]
        if missing:
            raise ValueError(f"{path}: malformed function task {rec.get('id')!r}: missing field {missing[0]!r}")
        try:
            check_id(rec)
            check_task(rec)
            check_finite(rec)
        except ValueError as e:
            raise ValueError(f"{path}: malformed function task {str(rec['id'])!r}: {e}") from None
        tasks[str(rec["id"])] = rec
    return tasks


def check_task(rec: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the field when a task cannot be played or would reward a wrong answer
    (module docstring)."""
    case = rec.get("test_case")
    if not isinstance(case, list) or len(case) != 4:
        raise ValueError(f"field 'test_case' must be a list of four integers, got {case!r:.60}")
    bad = [v for v in case if isinstance(v, bool) or not isinstance(v, int)]
    if bad:
        raise ValueError(f"field 'test_case' must hold integers, got {type(bad[0]).__name__} {bad[0]!r:.30}")
    exp = rec.get("expected_result")
    if isinstance(exp, bool) or not isinstance(exp, (int, float)):
        raise ValueError(f"field 'expected_result' must be a number, got {type(exp).__name__} {exp!r:.30}")
    if not math.isfinite(exp):
        raise ValueError(f"field 'expected_result' is not finite ({exp!r})")
    try:
        got = safe_eval(rec.get("rule"), case)
    except RuleError as e:
        raise ValueError(f"field 'rule' {rec.get('rule')!r:.80} cannot be evaluated on the test case: {e}") from None
    if abs(got - float(exp)) > REL_TOL * max(1.0, abs(float(exp))):
        raise ValueError(f"field 'expected_result' {exp!r} does not follow from the rule {rec['rule']!r} on the test "
                         f"case {case} (which gives {format_number(got)})")


def build_rows(tasks: dict[str, dict[str, Any]], split: str) -> list[dict[str, Any]]:
    rows = []
    for i, (tid, t) in enumerate(tasks.items()):
        rows.append(FunctionGym.userrl_row(tid, SYSTEM_PROMPT, USER_MESSAGE, str(float(t["expected_result"])),
                                           split, i))
    return rows


_INT = re.compile(r"[+-]?\d+")
_NUM = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _parse_number(text: str) -> float | None:
    t = text.strip().strip("`'\"").rstrip(".").strip()
    try:
        return float(Fraction(t.replace(" ", ""))) if "/" in t else float(t)
    except (ValueError, ZeroDivisionError, OverflowError):
        pass
    nums = _NUM.findall(t)
    if len(nums) == 1:
        try:
            return float(nums[0])
        except (ValueError, OverflowError):
            return None
    return None


@register_gym
class FunctionGym(Gym):
    name = "function"
    env_name = "FunctionGym"

    def reset_state(self) -> str:
        self.test_retrieved = False
        return ""

    def hidden_facts(self) -> list[str]:
        return [str(self.task["rule"]), str(float(self.task["expected_result"]))]

    def step(self, choice: str, content: str) -> StepResult:
        if self.done:
            return StepResult("The episode is already over.", 0.0, True, {"error": "episode_over"})
        self.steps += 1
        c = str(choice or "").strip().strip("[]").lower()
        text = content if isinstance(content, str) else ("" if content is None else str(content))
        text = text.strip()
        if c == "action":
            return self._action(text)
        if c == "search":
            if text.strip("`'\". ").lower() != "test":
                return self._finish("Invalid search: the only valid search content is `test` (to retrieve the "
                                    "test case).", 0.0, False, {"error": "invalid_search"})
            self.test_retrieved = True
            case = " ".join(str(v) for v in self.task["test_case"])
            return self._finish(f"The test case is: {case}", 0.0, False, {"test_retrieved": True})
        if c == "answer":
            return self._answer(text)
        return self._finish(f"Invalid choice {choice!r}: use `action` (four integers), `search` (`test`) or "
                            "`answer` (one number).", 0.0, False, {"error": "invalid_choice"})

    def _action(self, text: str) -> StepResult:
        parts = [p for p in re.split(r"[\s,;]+", text.strip("[]() ")) if p]
        if len(parts) != 4 or not all(_INT.fullmatch(p) for p in parts):
            return self._finish("Invalid action: provide exactly four integers separated by spaces, e.g. `1 2 3 4`.",
                                0.0, False, {"error": "malformed_action"})
        vals = [int(p) for p in parts]
        if any(abs(v) > MAX_INPUT for v in vals):
            return self._finish(f"Invalid action: each number must be at most {MAX_INPUT} in absolute value.",
                                0.0, False, {"error": "input_too_large"})
        try:
            out = safe_eval(self.task["rule"], vals)
        except RuleError as e:
            return self._finish(f"The function is undefined for {' '.join(parts)} ({e}). Try other numbers.",
                                0.0, False, {"error": "undefined"})
        return self._finish(f"The output for {' '.join(map(str, vals))} is {format_number(out)}", 0.0, False,
                            {"inputs": vals})

    def _answer(self, text: str) -> StepResult:
        x = _parse_number(text)
        if x is None or not math.isfinite(x):
            return self._finish("Invalid answer: provide a single number.", 0.0, False, {"error": "malformed_answer"})
        if not self.test_retrieved:
            return self._finish("You have not retrieved the test case yet: use `search` with `test` first.", 0.0,
                                False, {"error": "test_not_retrieved"})
        exp = float(self.task["expected_result"])
        if abs(x - exp) <= REL_TOL * max(1.0, abs(exp)):
            return self._finish("Correct! Your answer matches the hidden function's output on the test case.",
                                1.0, True, {"correct": True})
        return self._finish("Incorrect answer. You may keep probing and answer again.", 0.0, False,
                            {"correct": False})

    def _finish(self, obs: str, reward: float, done: bool, info: dict[str, Any]) -> StepResult:
        if not done and self.steps >= self.max_steps:
            done = True
            obs += "\nThe interaction limit has been reached; the episode is over."
            info["max_steps"] = True
        self.done = done
        info["step"] = self.steps
        return StepResult(obs, round(float(reward), 6), done, info)
