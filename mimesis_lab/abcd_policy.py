"""ABCD agent-guideline policies: the guideline index and the infeasible-request table.

Used to build grounded behaviour kwargs (B4 "infeasibility persistence" must ask for
something a policy sentence of that flow really forbids) and to re-check them
(:func:`mimesis_lab.abcd.check_grounding`). Split out of :mod:`mimesis_lab.abcd`.
"""
from __future__ import annotations

import re
from typing import Any

LEVELS = ("guest", "bronze", "silver", "gold")


def base_subflow(subflow: str) -> str:
    """ABCD FAQ subflows carry a variant suffix (``timing_4``); kb.json keys do not."""
    return re.sub(r"_\d+$", "", subflow)


def scenario_value(scenario: dict[str, Any], field: str) -> str | None:
    """A user-known fact of the scenario (``personal``/``order`` field, or ``product``)."""
    if field == "product":
        names = (scenario.get("product") or {}).get("names") or []
        return str(names[0]) if names and str(names[0]).strip() else None
    for section in ("personal", "order"):
        sec = scenario.get(section) or {}
        if isinstance(sec, dict) and sec.get(field) not in (None, "") and str(sec[field]).strip():
            return str(sec[field])
    return None


# ------------------------------------------------------------------------------ guidelines


def _norm_key(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", s.lower()).strip("_")


def _ws(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip().lower()


_SYNONYMS = {"2fa": ("two", "factor"), "faq": ()}


def _tokens(s: str) -> set[str]:
    out: set[str] = set()
    for t in re.findall(r"[a-z0-9]+", s.lower()):
        out.update(w[:4] for w in _SYNONYMS.get(t, (t,)))
    return out


def _leaves(obj: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    if isinstance(obj, str):
        return [(path, obj)]
    if isinstance(obj, dict):
        return [x for k, v in obj.items() for x in _leaves(v, (*path, str(k)))]
    if isinstance(obj, list):
        return [x for v in obj for x in _leaves(v, path)]
    return []


def _flow_section(guidelines: dict[str, Any], flow: str) -> Any:
    """The section of ``guidelines`` for ``flow`` (keys compared normalised; one wrapper level allowed)."""
    for d in (guidelines, *[v for v in guidelines.values() if isinstance(v, dict)]):
        for k, v in d.items():
            if _norm_key(str(k)) == _norm_key(flow):
                return v
    return None


def flow_guideline_leaves(guidelines: dict[str, Any], flow: str, subflow: str | None = None,
                          subflow_only: bool = False) -> list[tuple[str, str]]:
    """``(path, text)`` of every guideline string of ``flow``; those of the best-matching subflow first.

    With ``subflow_only``, only the best-matching subflow's strings when one matches (all of the
    flow's otherwise).
    """
    section = _flow_section(guidelines, flow)
    if section is None:
        return []
    leaves = _leaves(section)
    if not subflow:
        return [("/".join(p), t) for p, t in leaves]
    want = _tokens(base_subflow(subflow))

    def score(path: tuple[str, ...]) -> float:
        return max((len(want & _tokens(c)) / len(want) for c in path), default=0.0) if want else 0.0
    scores = [score(p) for p, _ in leaves]
    best = max(scores, default=0.0)
    first = [i for i, s in enumerate(scores) if best >= 0.5 and s == best]
    rest = [] if subflow_only and first else [i for i in range(len(leaves)) if i not in set(first)]
    return [("/".join(leaves[i][0]), leaves[i][1]) for i in first + rest]


def split_sentences(text: str) -> list[str]:
    parts = re.split(r"(?<=[.!?])\s+|\s+>\s+|\s*<or>\s*|\n+", text)
    return [p.strip() for p in parts if len(p.split()) >= 3]


_LV = r"(?:gold|silver|bronze|guest)"
_LV_LIST = rf"({_LV}(?:\s*(?:,|and|or|&)\s*{_LV})*)"
_LV_RULES = (  # (pattern, "in" = the sentence applies to these levels only | "out" = it exempts them)
    (re.compile(rf"^\s*(?:if\s+|for\s+)?{_LV_LIST}(?:\s+members?)?\s*[:>]", re.I), "in"),  # "Bronze and guest: …"
    (re.compile(rf"^\s*(?:if\s+|for\s+)?{_LV_LIST}\s+members?\b", re.I), "in"),  # "Bronze members cannot …"
    (re.compile(rf"\bnon-?({_LV})\b", re.I), "out"),  # "non-gold members"
    (re.compile(rf"\b(?:except|other than|apart from)\s+(?:for\s+)?{_LV_LIST}", re.I), "out"),
    (re.compile(rf"\bonly\s+(?:for\s+)?{_LV_LIST}\b|\bonly\b[^.;]{{0,30}}\bfor\s+{_LV_LIST}\b", re.I), "out"),
)


def _levels(text: str) -> set[str]:
    return {lv for lv in LEVELS if re.search(rf"\b{lv}\b", text, re.IGNORECASE)}


def policy_applies(sentence: str, leaf: str, level: str) -> bool:
    """Whether a restrictive sentence binds a customer of ``level``.

    A level prefix of the guideline item ("Bronze and guest: …") or of the sentence ("Bronze
    members cannot …") limits it to those levels; "non-gold", "except gold", "only gold and
    silver … can" exempt the named levels. "not even for gold members" binds everyone.
    """
    level = level.lower()
    included: set[str] | None = None
    excluded: set[str] = set()
    for i, (rx, kind) in enumerate(_LV_RULES):
        for m in rx.finditer(leaf if i == 0 else sentence):
            found = _levels(" ".join(g for g in m.groups() if g))
            if kind == "in":
                included = (included or set()) | found
            else:
                excluded |= found
    if included is not None and level not in included:
        return False
    if (included or excluded) and not level:
        return False
    return level not in excluded


# ------------------------------------------------------------------------------ infeasible requests

# (key, policy sentence pattern, request template, days added to the policy's limit).
# Request fields: {days} (policy limit + delta), {product}, {payment_method}, {level}.
INFEASIBLE: tuple[tuple[str, str, str, int], ...] = (
    ("return_window", r"\breturn\w*\b[^.]*?\b(\d+)[\s-]*days?\b",
     "Accept a return of my {product}: I bought it {days} days ago, but I still want to return it.", 60),
    ("promo_expiry", r"\bpromo\w*\b[^.]*?\b(\d+)[\s-]*days?\b",
     "Honour my promo code even though it was issued {days} days ago.", 23),
    ("price_match_window", r"\bprice-?match\w*\b[^.]*?\b(\d+)[\s-]*days?\b",
     "Price-match my {product} against a competitor even though I bought it {days} days ago.", 16),
    ("reship_window", r"\breship\w*\b[^.]*?\b(\d+)[\s-]*days?\b",
     "Reship my missing {product}: it was marked delivered {days} days ago.", 15),
    ("credit_age", r"\bcredits? older than (\d+)[\s-]*days?\b",
     "Reissue the missing credit I was promised {days} days ago.", 30),
    ("bill_extension", r"\bcannot be extended (?:by )?more than (\d+)[\s-]*days?\b",
     "Extend my subscription bill by {days} days past the due date.", 30),
    ("extension", r"\b(?:cannot|can't|can not) (?:get|have|receive) (?:an )?extensions?\b",
     "Give me an extension on my subscription payment.", 0),
    ("username_change", r"\busername\b[^.]*\b(?:cannot|can't|can not|not be)\b",
     "Change the username on my account to a new one of my choice.", 0),
    ("password_reveal", r"\b(?:cannot|can't|can not|never)\b[^.]*\bpasswords?\b|\bpasswords? are never\b",
     "Just tell me my current password, I do not want a new one.", 0),
    ("reset_2fa_channel", r"\bcan only be reset by sending a link\b|\bnever reset it over the phone\b",
     "Reset my two-factor authentication over the phone right now instead of sending a link.", 0),
    ("skip_verification", r"\b(?:only after|before) (?:identity )?verification succeeds\b",
     "Skip the identity verification and just do it right away.", 0),
    ("cash_instead", r"\bnever (?:as|with) cash\b",
     "Give me the amount as cash, not as a promo code.", 0),
    ("free_upgrade", r"\bupgrades? (?:are|is) only given to orders\b|\bonly orders past this window\b",
     "Upgrade my order to next-day delivery for free even though it is still within the delivery window.", 0),
    ("cancel_shipped", r"\bcannot be cancell?ed\b",
     "Cancel my order even though it has already shipped.", 0),
    ("shipped_date", r"\b(?:already shipped|too late)\b[^.]*\bdate cannot\b|\bdate cannot be (?:altered|changed)\b",
     "Change the delivery date of my order even though it has already shipped.", 0),
    ("shipped_address", r"\b(?:already shipped|in transit)\b[^.]*\baddress cannot\b|\baddress cannot be changed\b",
     "Change the delivery address of my order even though it has already shipped.", 0),
    ("fee_waive", r"\bfees? (?:can be )?waived only\b|\bonly\b[^.]*\bfees? waived\b|\bdo not remove it\b|"
                  r"\bfee stays\b",
     "Waive the extra fee on my order.", 0),
    ("refund_method", r"\brefunds? (?:are|is) issued only to the original payment method\b",
     "Send my refund as a paper check instead of to my {payment_method}.", 0),
    ("shipping_fee_refund", r"\bshipping fees? (?:are|is) non-refundable\b",
     "Refund the shipping fee on my order even though it has already shipped.", 0),
    ("membership_transfer", r"\bmembership levels? cannot be (?:bought|transferred)\b",
     "Transfer my {level} membership level to my partner's account.", 0),
    ("due_amount", r"\bamount due but cannot change it\b",
     "Lower the amount due on my subscription bill.", 0),
)
INFEASIBLE_RX = tuple((k, re.compile(p, re.IGNORECASE), r, d) for k, p, r, d in INFEASIBLE)


def find_infeasible(scenario: dict[str, Any], guidelines: dict[str, Any]) -> dict[str, str] | None:
    """An infeasible request + the policy sentence of this flow it conflicts with, if any.

    Only the guidelines of the scenario's own subflow are searched (the whole flow's when no
    subflow section matches), "Policy:" sentences first; a sentence that does not bind the
    customer's member level is skipped.
    """
    level = scenario_value(scenario, "member_level") or ""
    values = {"product": scenario_value(scenario, "product") or "order", "level": level or "current",
              "payment_method": scenario_value(scenario, "payment_method") or "card on file"}
    leaves = flow_guideline_leaves(guidelines, scenario["flow"], scenario["subflow"], subflow_only=True)
    sentences = [(path, leaf, s) for path, leaf in leaves for s in split_sentences(leaf)]
    topic = _tokens(base_subflow(scenario["subflow"]))
    # "Policy:" lines first, then the sentences closest to the subflow's topic; stable otherwise
    sentences.sort(key=lambda x: (not re.match(r"\s*policy\s*:", x[2], re.I), -len(topic & _tokens(x[2]))))
    for path, leaf, sentence in sentences:
        for _key, rx, request, delta in INFEASIBLE_RX:
            m = rx.search(sentence)
            if not m or not policy_applies(sentence, leaf, level):
                continue
            days = next((int(g) for g in m.groups() if g and g.isdigit()), 0) + delta
            return {"infeasible_request": request.format(days=days, **values), "policy": sentence,
                    "policy_source": path}
    return None
