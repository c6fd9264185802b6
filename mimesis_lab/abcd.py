"""ABCD behaviour-task rows (SPEC §2.4): loading, grounded kwargs, independent grounding check.

- :func:`load_abcd` reads ``{"train"|"dev"|"test": [...]}`` or a plain list, as plain JSON or as
  released (``abcd_v1.1.json.gz``); each record is validated with a msgspec struct; malformed
  records and duplicate ``convo_id`` are quarantined (row = 1-based index in its split list,
  reason with the JSON path).
- :func:`kb_reason` says why a scenario cannot be played with a kb (its subflow is not a kb
  subflow: the scripted support agent has no actions for it); the stage quarantines it.
- :func:`build_task_rows` gives one candidate row per valid conversation: a seeded
  ``round(neutral_share * n)`` are neutral, the rest cycle through B1..B13 in a seeded order
  (exactly balanced); where a behaviour cannot be grounded in a scenario it is swapped with
  a later conversation where both can. The kwargs are built from the scenario, kb.json and
  guidelines.json.
- :func:`check_grounding` re-checks a row independently of how it was built: withheld or
  contradicted information exists in the scenario, an infeasible request really conflicts
  with a restrictive policy sentence of that flow's guidelines, a false premise contradicts
  the scenario, a second intent is a different kb subflow.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

import msgspec

from mimesis_lab.abcd_policy import (  # noqa: F401  (re-exported)
    _ws, base_subflow, find_infeasible, flow_guideline_leaves, policy_applies, scenario_value,
)
from mimesis_lab.behaviors import BEHAVIOR_CODES, TAXONOMY
from mimesis_lab.config import BehaviorsParams
from mimesis_lab.io import InputFileError, Quarantine, load_json_document, to_raw

SPLITS = ("train", "dev", "test")
DATA_SOURCE = "usersim_behavior"

# ------------------------------------------------------------------------------ loading

Scalar = str | int | float | None
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class Product(msgspec.Struct):
    names: list[str]
    amounts: list[int | float]


class Scenario(msgspec.Struct):
    personal: dict[str, Scalar]
    order: dict[str, Scalar]
    product: Product
    flow: NonEmpty
    subflow: NonEmpty


class Conversation(msgspec.Struct):
    convo_id: int
    scenario: Scenario
    original: list[tuple[Literal["agent", "customer", "action"], str]]


@dataclass(frozen=True)
class AbcdRecord:
    convo_id: int
    split: str  # train | dev | test | all
    row: int  # 1-based index in its split list
    source_file: str
    scenario: dict[str, Any]  # the raw scenario dict
    original: list[tuple[str, str]]


def load_abcd(path: Path, quarantine: Quarantine) -> tuple[list[AbcdRecord], int]:
    """Valid records and the number of records read; bad records go to ``quarantine``."""
    doc = load_json_document(Path(path))
    if isinstance(doc, list):
        parts = [("all", doc)]
    elif isinstance(doc, dict):
        unknown = sorted(set(doc) - set(SPLITS))
        if unknown or not doc:
            raise InputFileError(
                f"{path}: expected an object with keys {list(SPLITS)} or a list, got keys {sorted(doc)}")
        parts = [(k, doc[k]) for k in SPLITS if k in doc]
        for k, v in parts:
            if not isinstance(v, list):
                raise InputFileError(f"{path}: `{k}` must be a list of conversations, got {type(v).__name__}")
    else:
        raise InputFileError(f"{path}: expected an object of split lists or a list, got {type(doc).__name__}")
    src, out, seen, rows_in = str(path), [], {}, 0
    for split, items in parts:
        for k, rec in enumerate(items):
            rows_in += 1
            where = f"$.{split}[{k}]" if split != "all" else f"$[{k}]"
            try:
                conv = msgspec.convert(rec, Conversation)
            except msgspec.ValidationError as e:
                msg = str(e)
                msg = msg.replace("`$", f"`{where}", 1) if " - at `$" in msg else f"{msg} - at `{where}`"
                quarantine.add(src, k + 1, f"schema: {msg}", to_raw(rec))
                continue
            if conv.convo_id in seen:
                first = seen[conv.convo_id]
                quarantine.add(src, k + 1, f"duplicate: convo_id {conv.convo_id} already read at `{first}`",
                               to_raw(rec))
                continue
            seen[conv.convo_id] = where
            out.append(AbcdRecord(conv.convo_id, split, k + 1, src, rec["scenario"],
                                  [(s, t) for s, t in conv.original]))
    return out, rows_in


def kb_reason(record: AbcdRecord, kb: dict[str, list[str]]) -> str | None:
    """``unknown subflow: …`` when the scenario's subflow (FAQ variants by their base, ``timing_4`` →
    ``timing``) is not a key of ``kb``, else ``None``."""
    sub = str(record.scenario.get("subflow"))
    if base_subflow(sub) in kb:
        return None
    return (f"unknown subflow: scenario subflow {sub!r} (flow {record.scenario.get('flow')!r}, convo_id "
            f"{record.convo_id}) is not in the kb ({len(kb)} subflows), so the support agent has no actions for it")


def record_raw(record: AbcdRecord) -> str:
    """The quarantine ``raw`` of a loaded record."""
    return to_raw({"convo_id": record.convo_id, "scenario": record.scenario,
                   "original": [list(t) for t in record.original]})


def load_kb(path: Path) -> dict[str, list[str]]:
    doc = load_json_document(Path(path))
    if not isinstance(doc, dict) or not doc or not all(
            isinstance(v, list) and all(isinstance(a, str) for a in v) for v in doc.values()):
        raise InputFileError(f"{path}: kb must be a non-empty object subflow -> list of action names")
    return doc


def load_guidelines(path: Path) -> dict[str, Any]:
    doc = load_json_document(Path(path))
    if not isinstance(doc, dict) or not doc:
        raise InputFileError(f"{path}: guidelines must be a non-empty JSON object (flow -> sections)")
    return doc


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def scenario_key(scenario: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(scenario).encode("utf-8")).hexdigest()[:16]


# ------------------------------------------------------------------------------ kwargs builders

ACTION_FIELDS = {  # user-known slots per ABCD action (after the ABCD ontology)
    "validate-purchase": ("username", "email", "order_id"),
    "verify-identity": ("order_id", "zip_code", "phone", "email", "username"),
    "enter-details": ("full_address", "username", "email"),
    "record-reason": ("street_address", "payment_method", "phone"),
    "update-account": ("street_address", "payment_method", "phone"),
    "update-order": ("payment_method", "full_address"),
    "membership": ("member_level",),
}
FALLBACK_FIELDS = ("order_id", "username", "email", "zip_code", "member_level", "phone", "payment_method",
                   "street_address")
ACTION_CONSTRAINT = {  # a constraint that rules out what this kb action would offer
    "offer-refund": "refuses any refund that is not cash back",
    "promo-code": "refuses promo codes or store credit of any kind",
    "update-order": "does not want the order itself modified", "send-link": "will not click links or check email",
    "verify-identity": "will not answer further verification questions",
    "validate-purchase": "will not look up order details again", "make-password": "does not want a new password",
    "membership": "does not want membership terms mentioned", "make-purchase": "will not place a new order",
    "notify-team": "does not want the issue passed to another team",
    "update-account": "does not want the account settings touched",
    "enter-details": "will not repeat details already given", "record-reason": "refuses to explain the reason again",
    "shipping-status": "does not want to wait for a shipping check", "try-again": "will not retry anything",
    "ask-the-oracle": "does not want anything looked up, wants an answer now",
    "log-out-in": "refuses to log out and back in",
}
PRESSURES = ("needs this fixed in the next 10 minutes", "is about to board a flight",
             "has already waited on hold for an hour", "has a meeting starting right now")


def _perturb(value: str) -> str | None:
    digits = [i for i, c in enumerate(value) if c.isdigit()]
    if not digits:
        return None
    i = digits[-1]
    return value[:i] + str((int(value[i]) + 3) % 10) + value[i + 1:]


def _withheld(sc: dict[str, Any], kb: dict[str, list[str]], rng: random.Random) -> dict[str, Any] | None:
    needed = [f for a in kb.get(base_subflow(sc["subflow"]), []) for f in ACTION_FIELDS.get(a, ())]
    present = [f for f in dict.fromkeys(needed) if scenario_value(sc, f)]
    if not present:
        present = [f for f in FALLBACK_FIELDS if scenario_value(sc, f)][:1]
    if not present:
        return None
    f = present[0] if len(present) == 1 else rng.choice(present)
    return {"withheld_field": f, "withheld_value": scenario_value(sc, f)}


def _b1(sc, kb, g, rng, budget):
    opts = [(f, tpl) for f, tpl in (
        ("payment_method", "only satisfied if the resolution goes back to the {v} on file, but never says so"),
        ("product", "expects the agent to name the {v} without being told which item it is"),
        ("member_level", "expects {v}-member priority treatment without mentioning the membership"),
        ("customer_name", "expects to be addressed by name ({v}) and judges the agent on it"),
    ) if scenario_value(sc, f)]
    if not opts:
        return None
    f, tpl = rng.choice(opts)
    v = scenario_value(sc, f)
    return {"hidden_criterion": tpl.format(v=v), "criterion_field": f, "criterion_value": v}


def _b2(sc, kb, g, rng, budget):
    opts = [(f, tpl) for f, tpl in (("email", "also wants a written confirmation sent to {v}"),
                                    ("phone", "also wants a text message confirmation to {v}"))
            if scenario_value(sc, f)]
    opts.append(("", "also insists that everything is completed today"))
    f, tpl = rng.choice(opts)
    return {"added_requirement": tpl.format(v=scenario_value(sc, f) if f else ""), "requirement_field": f,
            "add_after_turn": rng.randint(2, max(2, budget // 2))}


def _b6(sc, kb, g, rng, budget):
    cur = base_subflow(sc["subflow"])
    others = sorted(k for k in kb if k != cur)
    if not others:
        return None
    return {"second_subflow": rng.choice(others), "switch_after_turn": rng.randint(2, max(2, budget // 2))}


def _b7(sc, kb, g, rng, budget):
    acts = [a for a in kb.get(base_subflow(sc["subflow"]), []) if a in ACTION_CONSTRAINT]
    chosen = acts[-3:]
    cons = [ACTION_CONSTRAINT[a] for a in chosen]
    for extra in ("must be resolved in this chat without any transfer", "will not share any more personal details",
                  "will not follow any self-service instructions"):
        if len(cons) < 3:
            cons.append(extra)
    return {"constraints": cons, "ruled_out_actions": chosen}


def _b8(sc, kb, g, rng, budget):
    opts = []
    lv = (scenario_value(sc, "member_level") or "").lower()
    if lv:
        false = "gold" if lv != "gold" else "silver"
        opts.append(("member_level", lv, false, f"I'm a {false} member, so I expect {false}-member treatment."))
    pm = (scenario_value(sc, "payment_method") or "").lower()
    if pm:
        false = "paypal" if pm != "paypal" else "credit card"
        opts.append(("payment_method", pm, false, f"I paid with {false}, as your records show."))
    n = scenario_value(sc, "num_products")
    if n and n.isdigit():
        false = str(int(n) + 2)
        opts.append(("num_products", n, false, f"I ordered {false} items in that order."))
    if not opts:
        return None
    f, true, false, premise = rng.choice(opts)
    return {"premise_field": f, "true_value": true, "false_value": false, "false_premise": premise}


def _b11(sc, kb, g, rng, budget):
    opts = [f for f in ("order_id", "zip_code", "phone", "username", "email", "street_address")
            if scenario_value(sc, f) and _perturb(scenario_value(sc, f) or "")]
    if not opts:
        return None
    f = rng.choice(opts)
    v = scenario_value(sc, f) or ""
    return {"contradicted_field": f, "original_value": v, "contradicting_value": _perturb(v)}


def _b12(sc, kb, g, rng, budget):
    cur = base_subflow(sc["subflow"])
    reqs = [f"resolve my {cur.replace('_', ' ')} issue"]
    others = sorted(k for k in kb if k != cur)
    if others:
        reqs.append(f"also handle a {rng.choice(others).replace('_', ' ')} question")
    for f in ("email", "phone", "street_address", "member_level"):
        if scenario_value(sc, f):
            reqs.append(f"confirm that my {f.replace('_', ' ')} on file is {scenario_value(sc, f)}")
            break
    reqs += ["tell me how long everything will take", "send me a summary of all of it"][: max(0, 4 - len(reqs))]
    return {"requests": reqs}


def _b13(sc, kb, g, rng, budget):
    lv = scenario_value(sc, "member_level")
    if lv:
        return {"entitlement": f"as a {lv} member, demands to be served first and talks down to the agent",
                "entitlement_field": "member_level"}
    return {"entitlement": "demands immediate service as a loyal customer and talks down to the agent",
            "entitlement_field": ""}


BUILDERS: dict[str, Callable[..., dict[str, Any] | None]] = {
    "B1": _b1, "B2": _b2,
    "B3": lambda sc, kb, g, rng, b: _withheld(sc, kb, rng),
    "B4": lambda sc, kb, g, rng, b: find_infeasible(sc, g),
    "B5": lambda sc, kb, g, rng, b: _withheld(sc, kb, rng),
    "B6": _b6, "B7": _b7, "B8": _b8,
    "B9": lambda sc, kb, g, rng, b: {"pressure": rng.choice(PRESSURES)},
    "B10": lambda sc, kb, g, rng, b: {"abandoned_thread": base_subflow(sc["subflow"]),
                                      "abandon_after_turn": rng.randint(2, max(2, b - 1))},
    "B11": _b11, "B12": _b12, "B13": _b13,
}
def build_kwargs(behavior: str, record: AbcdRecord, kb: dict[str, list[str]], guidelines: dict[str, Any],
                 params: BehaviorsParams) -> dict[str, Any] | None:
    """Grounded kwargs for ``behavior`` in this scenario, or ``None`` if the scenario cannot ground it."""
    rng = random.Random(f"{params.seed}:{record.convo_id}:{behavior}")
    return BUILDERS[behavior](record.scenario, kb, guidelines, rng, params.turn_budget)


def assign_behaviors(records: list[AbcdRecord], feasible: Callable[[int, str], bool],
                     neutral_share: float, seed: int) -> list[str]:
    """Behaviour per record (``N`` = neutral): seeded neutral subset, seeded balanced cycle, feasibility swaps."""
    n = len(records)
    rng = random.Random(seed)
    order_idx = sorted(range(n), key=lambda i: records[i].convo_id)
    rng.shuffle(order_idx)
    k = round(neutral_share * n)
    out = ["N"] * n
    rest = order_idx[k:]
    cycle = list(BEHAVIOR_CODES)
    rng.shuffle(cycle)
    assigned = [cycle[j % len(cycle)] for j in range(len(rest))]
    for a in range(len(rest)):
        if feasible(rest[a], assigned[a]):
            continue
        for b in list(range(a + 1, len(rest))) + list(range(a)):
            if feasible(rest[b], assigned[a]) and feasible(rest[a], assigned[b]):
                assigned[a], assigned[b] = assigned[b], assigned[a]
                break
    for j, i in enumerate(rest):
        out[i] = assigned[j]
    return out


def task_row(record: AbcdRecord, behavior: str, kwargs: dict[str, Any], params: BehaviorsParams) -> dict[str, Any]:
    sc = record.scenario
    username = scenario_value(sc, "username")
    name = scenario_value(sc, "customer_name")
    return {
        "task_id": f"{record.convo_id}-{behavior}",
        "conversation_id": str(record.convo_id),
        "user_id": username or (f"name:{name}" if name else f"abcd:{record.convo_id}"),
        "scenario_key": scenario_key(sc),
        "scenario": canonical_json(sc),
        "behavior_ids": json.dumps([] if behavior == "N" else [behavior]),
        "kwargs": canonical_json(kwargs),
        "flow": sc["flow"],
        "subflow": sc["subflow"],
        "turn_budget": params.turn_budget,
        "data_source": DATA_SOURCE,
        "needs_trace": TAXONOMY[behavior].needs_trace,
        "abcd_split": record.split,
    }


def build_task_rows(records: list[AbcdRecord], kb: dict[str, list[str]], guidelines: dict[str, Any],
                    params: BehaviorsParams) -> list[dict[str, Any]]:
    """One candidate row per valid record (in input order); run :func:`check_grounding` on each."""
    cache: dict[tuple[int, str], dict[str, Any] | None] = {}

    def kw(i: int, b: str) -> dict[str, Any] | None:
        if (i, b) not in cache:
            cache[(i, b)] = build_kwargs(b, records[i], kb, guidelines, params)
        return cache[(i, b)]

    behaviors = assign_behaviors(records, lambda i, b: kw(i, b) is not None, params.neutral_share, params.seed)
    rows = []
    for i, (rec, b) in enumerate(zip(records, behaviors)):
        # a behaviour the scenario cannot ground keeps empty kwargs: the grounding check rejects it
        kwargs = {} if b == "N" else (kw(i, b) or dict.fromkeys(TAXONOMY[b].kwargs, ""))
        rows.append(task_row(rec, b, kwargs, params))
    return rows


# ------------------------------------------------------------------------------ grounding check

_RESTRICTION = re.compile(r"\b(cannot|can't|can not|not|no|non-\w+|only|within|expire\w*|must|never|unable|stays|"
                          r"too late|limit\w*|last|except|more than|older than|before)\b", re.IGNORECASE)
_GENERIC = frozenset("the and for with that this from your you are was were have has will would can could please want "
                     "need even though anyway ago days day customer customers member members account item items them "
                     "they their then just still also into about what when which".split())
_DAYS = re.compile(r"\b(\d+)[\s-]*days?\b", re.IGNORECASE)
_VALUE_KEY = {"withheld_field": "withheld_value", "criterion_field": "criterion_value",
              "contradicted_field": "original_value", "premise_field": "true_value"}


def _stems(text: str) -> set[str]:
    return {w[:5] for w in re.findall(r"[a-z]{3,}", text.lower()) if w not in _GENERIC}


def _check_infeasible(kw: dict[str, Any], sc: dict[str, Any], guidelines: dict[str, Any]) -> str | None:
    request, policy = str(kw.get("infeasible_request") or ""), str(kw.get("policy") or "")
    if not request or not policy:
        return "B4 needs an infeasible_request and the policy sentence it conflicts with"
    leaf = next((t for _, t in flow_guideline_leaves(guidelines, sc["flow"]) if _ws(policy) in _ws(t)), None)
    if leaf is None:
        return f"policy sentence not in the guidelines of flow {sc['flow']!r}: {policy[:80]!r}"
    if not _RESTRICTION.search(policy):
        return f"policy sentence states no restriction: {policy[:80]!r}"
    if not _stems(request) & _stems(policy):
        return f"request {request[:60]!r} does not touch the subject of policy {policy[:60]!r}"
    limit = _DAYS.search(policy)
    if limit:
        asked = _DAYS.search(request)
        if not asked or int(asked.group(1)) <= int(limit.group(1)):
            return f"request is within the policy's {limit.group(1)}-day limit"
    level = scenario_value(sc, "member_level") or ""
    if not policy_applies(policy, leaf, level):
        return f"policy does not bind a customer of member level {level or 'unknown'!r}"
    return None


def check_grounding(row: dict[str, Any], kb: dict[str, list[str]], guidelines: dict[str, Any]) -> str | None:
    """Reason why ``row``'s behaviour conditioning is not grounded, or ``None`` if it is."""
    try:
        sc = json.loads(row["scenario"])
        ids = json.loads(row["behavior_ids"])
        kw = json.loads(row["kwargs"])
    except (KeyError, TypeError, ValueError) as e:
        return f"row is not decodable: {e}"
    if not isinstance(ids, list) or len(ids) > 1 or any(b not in BEHAVIOR_CODES for b in ids) \
            or not isinstance(kw, dict):
        return f"behavior_ids must be [] or [B1..B13] and kwargs an object, got {row['behavior_ids']}"
    if not ids:
        return None if not kw else "neutral row must have empty kwargs"
    b = ids[0]
    missing = [k for k in TAXONOMY[b].kwargs if k not in kw]
    if missing:
        return f"{b} kwargs miss {missing}"
    for key, vkey in {**_VALUE_KEY, "requirement_field": None, "entitlement_field": None}.items():
        if key not in kw or (not kw[key] and key in ("requirement_field", "entitlement_field")):
            continue
        f = str(kw[key])
        actual = scenario_value(sc, f) if f else None
        if actual is None:
            return f"{key} {f!r} is not in the scenario (the user cannot know it)"
        if vkey and vkey in kw and _ws(str(kw[vkey])) != _ws(actual):
            return f"{vkey} {kw[vkey]!r} is not the scenario's {f} {actual!r}"
    if b == "B4":
        return _check_infeasible(kw, sc, guidelines)
    if b == "B6":
        second, cur = str(kw["second_subflow"]), base_subflow(sc["subflow"])
        if second not in kb:
            return f"second_subflow {second!r} is not a kb subflow"
        if base_subflow(second) == cur:
            return f"second_subflow {second!r} is the current subflow"
    if b == "B8" and _ws(str(kw["false_value"])) in ("", _ws(str(kw["true_value"]))):
        return f"false premise {kw['false_premise']!r} does not contradict the scenario ({kw['premise_field']} = " \
               f"{kw['true_value']!r})"
    if b == "B11" and _ws(str(kw["contradicting_value"])) in ("", _ws(str(kw["original_value"]))):
        return f"contradicting_value {kw['contradicting_value']!r} does not contradict {kw['original_value']!r}"
    if b == "B7":
        bad = [a for a in kw.get("ruled_out_actions") or [] if a not in kb.get(base_subflow(sc["subflow"]), [])]
        if bad:
            return f"ruled_out_actions {bad} are not kb actions of subflow {sc['subflow']!r}"
    if b == "B12" and len(kw.get("requests") or []) < 3:
        return "request overloading needs at least 3 requests"
    return None
