"""TravelGym expert: search the options, ask the user about what tells them apart, recommend the one
option that fits every preference the user stated.

1. ``search`` with the user's request: the options come back with their attributes and features
   (the only catalogue the agent has).
2. Preferences already in the request ("no more than $700") are read first.
3. While more than one option fits: ask about a feature that splits the options still in the
   running — the budget first, then the features (tags) that split them most evenly, then the other
   attributes — and turn the reply into a constraint (:func:`parse_reply`): a feature wanted or
   refused ("no spicy food"), a bound on a number ("at least 3 bedrooms", "under $150"), a value of
   a category ("first class"). An uninformative reply gets the question once more in other words;
   "I don't mind" drops the feature.
4. Once one option is left, one closing question ("anything else that matters?") catches a
   preference that did not split the options; then ``answer`` with the option's id.

Exploring, it may ask the features in a shuffled order, start with one that splits nothing, skip the
closing question or recommend while two options are still in the running.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Generator

from mimesis_lab.envs.gyms.experts.base import Action, Expert
from mimesis_lab.envs.gyms.text import words

__all__ = ["TravelExpert", "Option", "Constraint", "parse_options", "parse_reply"]

_PRICE_WORDS = {"budget", "price", "spend", "cost", "cheap", "cheaper", "afford", "expensive", "pay"}
_MAX_CUES = ("under", "below", "less than", "at most", "up to", "within", "no more than", "not more than",
             "maximum", "max", "cheaper than", "before", "or less", "no longer than")
_MIN_CUES = ("at least", "minimum", "min", "more than", "over", "above", "or more", "room for", "fits", "fit")
_NEGATIONS = ("no", "not", "without", "avoid", "never", "cannot", "can't", "don't", "nothing")
_DONT_MIND = re.compile(r"\b(don't mind|do not mind|no preference|doesn't matter|does not matter|not important|"
                        r"don't care)\b", re.IGNORECASE)
_ALL_SAID = re.compile(r"\b(that's everything|that is everything|that's all|nothing else|no other)\b", re.IGNORECASE)
# Travel idioms an agent knows: "nonstop" means zero stops.
_IDIOMS = {("nonstop", "non-stop", "direct"): ("stops", "max", 0.0)}


@dataclass
class Option:
    id: str
    name: str
    numbers: dict[str, float] = field(default_factory=dict)
    categories: dict[str, str] = field(default_factory=dict)
    tags: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Constraint:
    """``kind`` is ``tag`` (``value`` wanted, or refused when ``negated``), ``max``/``min`` (a bound on
    the number ``attr``) or ``equals`` (the category ``attr`` is ``value``)."""

    kind: str
    attr: str = ""
    value: str | float = ""
    negated: bool = False

    def holds(self, o: Option) -> bool:
        if self.kind == "tag":
            return (self.value in o.tags) != self.negated
        if self.kind in ("max", "min"):
            v = o.numbers.get(self.attr)
            return v is not None and (v <= self.value if self.kind == "max" else v >= self.value)
        return o.categories.get(self.attr, "").lower() == str(self.value).lower()


def parse_options(observation: str) -> list[Option]:
    """The options of a search result (``[id] name | key: value | … | features: a, b | description``)."""
    out = []
    for line in observation.splitlines():
        m = re.match(r"\[([^\]]+)\]\s*(.*)", line.strip())
        if not m:
            continue
        parts = [p.strip() for p in m.group(2).split(" | ")]
        o = Option(id=m.group(1).strip(), name=parts[0])
        for p in parts[1:]:
            kv = re.match(r"([a-z][a-z ]*): (.+)$", p)
            if kv is None:
                continue
            key, value = kv.group(1).replace(" ", "_"), kv.group(2).strip()
            if key == "features":
                o.tags = {t.strip().lower() for t in value.split(",") if t.strip()}
            elif key == "price":
                num = re.search(r"\$?(-?\d+(?:\.\d+)?)", value)
                if num:
                    o.numbers["price"] = float(num.group(1))
            else:
                try:
                    o.numbers[key] = float(value)
                except ValueError:
                    o.categories[key] = value
        out.append(o)
    return out


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9$]+(?:'[a-z]+)?|\$", text.lower().replace("-", " "))


def _negated(tokens: list[str], at: int) -> bool:
    return any(t in _NEGATIONS for t in tokens[max(0, at - 3):at])


def parse_reply(reply: str, options: list[Option], asked: tuple[str, str] | None = None) -> list[Constraint]:
    """The constraints a user's reply states about the options' features (module docstring).

    ``asked`` = the feature the question was about (``("tag", t)``, ``("number", attr)`` or
    ``("category", attr)``): an affirmative reply that names nothing else wants that tag, and a bare
    number bounds that attribute."""
    low = reply.lower()
    toks = _tokens(reply)
    rw = words(reply)
    out: list[Constraint] = []
    tags = sorted({t for o in options for t in o.tags})
    tag_words = {t: words(t) or {t} for t in tags}
    for t in tags:
        tw = tag_words[t]
        hit = tw & rw
        others = set().union(*(tag_words[u] for u in tags if u != t)) if len(tags) > 1 else set()
        if hit and (hit == tw or (len(hit) * 2 >= len(tw) and not hit & others)):
            first = next((i for i, tok in enumerate(toks) if words(tok) & hit), None)
            out.append(Constraint("tag", value=t, negated=first is not None and _negated(toks, first)))
    numbers = sorted({a for o in options for a in o.numbers})
    for cues, (attr, kind, value) in _IDIOMS.items():
        if attr in numbers and any(re.search(rf"\b{re.escape(c)}\b", low) for c in cues):
            out.append(Constraint(kind, attr, value))
    for m in re.finditer(r"(\$)?\s?(\d+(?:\.\d+)?)", low):
        num = float(m.group(2))
        left = low[max(0, m.start() - 40):m.start()]
        right = low[m.end():m.end() + 20]
        near = words(left[-25:] + " " + right)
        if m.group(1) or near & _PRICE_WORDS or re.match(r"\s*(per|a) (night|person|ticket|day)", right):
            attr = "price" if "price" in numbers else ""
        else:
            scored = [(len(_name_words(a) & (near | rw)), a) for a in numbers if a != "price"]
            best = max(scored, default=(0, ""))
            attr = best[1] if best[0] else (asked[1] if asked and asked[0] == "number" else "")
        if not attr:
            continue
        lo = left + " " + right
        if any(re.search(rf"\b{re.escape(c)}\b", left[-22:]) or re.search(rf"\b{re.escape(c)}\b", right[:12])
               for c in _MIN_CUES) and not re.search(r"\b(not|no|don't)\b[^.]*\bmore than\b", lo):
            kind = "min"
        elif any(re.search(rf"\b{re.escape(c)}\b", lo) for c in _MAX_CUES) or attr == "price":
            kind = "max"
        else:
            kind = "min" if attr.startswith("max_") else ""
        if kind:
            out.append(Constraint(kind, attr, num))
    for attr in sorted({a for o in options for a in o.categories}):
        values = {o.categories[attr] for o in options if attr in o.categories}
        for v in sorted(values):
            if re.search(rf"(?<![a-z0-9]){re.escape(v.lower())}(?![a-z0-9])", low):
                out.append(Constraint("equals", attr, v))
    if not out and asked and asked[0] == "tag" and not _DONT_MIND.search(reply):
        first = next((i for i, tok in enumerate(toks) if tok in _NEGATIONS), None)
        out.append(Constraint("tag", value=asked[1], negated=first is not None and first < 2))
    return out


def _name_words(attr: str) -> set[str]:
    raw = set(attr.split("_"))
    feet = {"foot", "feet"} if "ft" in raw else set()
    return words(attr.replace("_", " ")) | {w for w in raw if len(w) == 2} | feet


class TravelExpert(Expert):
    gym = "travel"

    def policy(self) -> Generator[Action, str, None]:
        request = self.view.request.split("\nPlease recommend")[0].strip()
        obs = yield ("search", request)
        options = parse_options(obs)
        if not options:
            obs = yield ("search", "hotel flight restaurant car tour apartment train campsite")
            options = parse_options(obs)
        if not options:
            return
        constraints = parse_reply(request, options)
        asked: set[tuple[str, str]] = set()
        general_asked = 0
        closed = False

        def fits() -> list[Option]:
            return [o for o in options if all(c.holds(o) for c in constraints)]

        if self.coin(0.4):   # exploring: open with a feature that may not matter to the user
            first = self.explore.choice([("tag", t) for t in sorted({t for o in options for t in o.tags})]
                                        + [("number", a) for a in sorted({a for o in options for a in o.numbers})])
            asked.add(first)
            obs = yield ("action", _question(first, options, 0))
            constraints += parse_reply(obs, options, first)
        while self.turns_left > 1:
            cands = fits()
            if len(cands) <= 1 or (len(cands) == 2 and self.coin(0.15)):
                if closed or general_asked >= 3 or self.coin(0.25):
                    break
                obs = yield ("action", _GENERAL_QUESTIONS[general_asked % len(_GENERAL_QUESTIONS)])
                general_asked += 1
                new = parse_reply(obs, options)
                constraints += new
                closed = not new or bool(_ALL_SAID.search(obs))
                continue
            settled = {("number" if c.kind in ("max", "min") else c.kind.replace("equals", "category"),
                        c.attr or str(c.value)) for c in constraints}
            todo = [f for f in _features(options, cands, shuffle=self.explore if self.coin(0.5) else None)
                    if f not in asked and f not in settled]
            if not todo:
                if general_asked >= 3:
                    break
                obs = yield ("action", _GENERAL_QUESTIONS[general_asked % len(_GENERAL_QUESTIONS)])
                general_asked += 1
                constraints += parse_reply(obs, options)
                continue
            f = todo[0]
            asked.add(f)
            obs = yield ("action", _question(f, options, 0))
            new = parse_reply(obs, options, f)
            if not new and not _DONT_MIND.search(obs) and not _ALL_SAID.search(obs) and self.turns_left > 2:
                obs = yield ("action", _question(f, options, 1))   # uninformative: ask again, differently
                new = parse_reply(obs, options, f)
            constraints += new
        cands = fits() or sorted(options, key=lambda o: -sum(c.holds(o) for c in constraints))
        yield ("answer", cands[0].id)


_GENERAL_QUESTIONS = ("Is there anything else that matters to you for this booking?",
                      "Any other preferences I should know about before I recommend one?",
                      "What else is important to you here?")


def _features(options: list[Option], cands: list[Option], shuffle) -> list[tuple[str, str]]:
    """Features that split ``cands``: the price first, then tags by how evenly they split, then the
    other numbers and categories."""
    n = len(cands)
    tags = sorted({t for o in options for t in o.tags})
    split_tags = [t for t in tags if 0 < sum(t in o.tags for o in cands) < n]
    split_tags.sort(key=lambda t: abs(sum(t in o.tags for o in cands) - n / 2))
    nums = [a for a in sorted({a for o in options for a in o.numbers})
            if len({o.numbers.get(a) for o in cands}) > 1]
    cats = [a for a in sorted({a for o in options for a in o.categories})
            if len({o.categories.get(a) for o in cands}) > 1]
    feats = ([("number", "price")] if "price" in nums else []) + [("tag", t) for t in split_tags] + \
        [("number", a) for a in nums if a != "price"] + [("category", a) for a in cats]
    if shuffle is not None:
        shuffle.shuffle(feats)
    return feats


def _question(f: tuple[str, str], options: list[Option], variant: int) -> str:
    kind, name = f
    label = name.replace("_", " ")
    if kind == "number" and name == "price":
        return ("Do you have a budget in mind?", "What is the most you would like to spend?")[variant]
    if kind == "tag":
        return (f"Is {label} important to you?", f"Would you want an option with {label}?")[variant]
    if kind == "number":
        return (f"Do you have a requirement on the {label}?", f"How much does the {label} matter to you?")[variant]
    values = sorted({o.categories[name] for o in options if name in o.categories})
    return (f"Do you have a preference for the {label} ({', '.join(values)})?",
            f"Which {label} would you like: {' or '.join(values)}?")[variant]
