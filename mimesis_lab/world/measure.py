"""Structural properties of a generated world, measured on its files (what the tests assert).

- :func:`withholding` — share of user turns whose private reason names a hidden fact (a
  preference value, the entity, a withheld field…) that the public message does not state;
- :func:`enactment` — the project's rule judge (the simulator-RL reward) re-run on every
  behaviour-conditioned ThoughtTrace support conversation: share exhibiting the behaviour
  (exhibit ≥ 0.5), for the conversations drawn to enact it and for the others;
- :func:`context_prediction` — how well the public trip purpose of a travel request predicts the
  hidden area and amenity (majority table fitted on one half of the users, scored on the other)
  against the majority-class baseline, and the same for a food lover's cuisine → their food;
- :func:`lengths` — words per reason and per message, user turns per conversation;
- :func:`word_coverage` — share of word tokens of held-out users' chats/conversations seen in
  the other users' (digits folded), a tokenizer-free proxy of the BPE coverage.
"""
from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from statistics import median
from typing import Any, Iterable

from mimesis_lab.judges.abcd_agent import GREETING
from mimesis_lab.judges.behavior_judge import BehaviorJudgeRequest, RuleJudge
from mimesis_lab.world import lexicon as L

__all__ = ["read_jsonl", "withholding", "enactment", "context_prediction", "lengths", "word_coverage", "measure_all"]


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _reason(m: dict[str, Any]) -> str:
    return " ".join(r["content"] for r in m.get("reasons") or [])


def withholding(tt: list[dict[str, Any]], meta: list[dict[str, Any]]) -> dict[str, Any]:
    hidden = {m["id"]: [h.lower() for h in m.get("hidden") or [] if h] for m in meta}
    domain = {m["id"]: m["domain"] for m in meta}
    turns = withheld = 0
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for rec in tt:
        hs = hidden.get(rec["id"], [])
        for m in rec["messages"]:
            if m["type"] != "user" or not m.get("reasons"):
                continue
            r, c = _reason(m).lower(), m["content"].lower()
            w = any(h in r and h not in c for h in hs)
            turns += 1
            withheld += w
            per[domain.get(rec["id"], "?")][0] += 1
            per[domain.get(rec["id"], "?")][1] += w
    return {"user_turns": turns, "withheld_share": withheld / max(1, turns),
            "by_domain": {d: round(w / max(1, n), 3) for d, (n, w) in sorted(per.items())}}


def enactment(tt: list[dict[str, Any]], meta: list[dict[str, Any]]) -> dict[str, Any]:
    judge = RuleJudge()
    by_id = {r["id"]: r for r in tt}
    on, off, shown = [], [], Counter()
    total = Counter()
    for m in meta:
        if m["domain"] != "support" or m.get("behavior") in (None, "N"):
            continue
        rec = by_id[m["id"]]
        opened = bool(rec["messages"]) and rec["messages"][0]["type"] == "assistant"
        log = [] if opened else [{"role": "agent", "content": GREETING}]
        priv = []
        for x in rec["messages"]:
            log.append({"role": "user" if x["type"] == "user" else "agent", "content": x["content"]})
            if x["type"] == "user":
                priv.append({"role": "user", "reasoning": _reason(x), "content": x["content"]})
        sc = m["scenario"]
        v = judge.judge(BehaviorJudgeRequest(m["behavior"], m["kwargs"], sc, sc["flow"], sc["subflow"], log, priv))
        e = float(getattr(v, "exhibit", 0.0))
        (on if m["enacted"] else off).append(e)
        total[m["behavior"]] += 1
        shown[m["behavior"]] += e >= 0.5
    n = len(on) + len(off)
    return {"conversations": n, "exhibited_share": (sum(e >= 0.5 for e in on + off) / n) if n else 0.0,
            "drawn_to_enact_share": len(on) / n if n else 0.0,
            "exhibit_mean_enacted": sum(on) / max(1, len(on)), "exhibit_mean_not_enacted": sum(off) / max(1, len(off)),
            "exhibited_by_behavior": {b: round(shown[b] / total[b], 2) for b in sorted(total, key=lambda x: int(x[1:]))}}


def _cv_score(pairs: list[tuple[str, str, str]], table_rows: list[tuple[str, str, str]]) -> tuple[float, float]:
    """Two-fold cross-validation over users. ``pairs``: (user, public context, hidden value) to score;
    ``table_rows``: (user, context, value) of the whole population. A user of one fold is predicted by
    the majority value of their context among the other fold's users; the baseline predicts the other
    fold's overall majority value (ties: the alphabetically first value)."""
    fold = {u: i % 2 for i, (u, _, _) in enumerate(sorted(table_rows))}
    tables: list[dict[str, Counter]] = [defaultdict(Counter), defaultdict(Counter)]
    overall = [Counter(), Counter()]
    for u, c, y in table_rows:
        tables[fold[u]][c][y] += 1
        overall[fold[u]][y] += 1

    def top(cnt: Counter) -> str | None:
        return min(cnt, key=lambda k: (-cnt[k], k)) if cnt else None
    acc = base = 0
    for u, c, y in pairs:
        other = 1 - fold[u]
        acc += (top(tables[other][c]) or top(overall[other])) == y
        base += top(overall[other]) == y
    return acc / len(pairs), base / len(pairs)


def context_prediction(tt: list[dict[str, Any]], population: list[dict[str, Any]],
                       travel_tasks: list[dict[str, Any]] | None = None,
                       chats: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Public context → hidden preference, one row per user (leave-one-user-out).

    The context of a scored user is read from public text only: the trip purpose named in their hotel
    requests (first messages of ThoughtTrace conversations and chats, TravelGym requests), the cuisine
    named in a guessing-game category; the hidden value is the user's trait. Majority value per context
    vs the overall majority value, both fitted on the other half of the users (:func:`_cv_score`).
    """
    users = {u["uid"]: u for u in population}
    phrase = {v[0]: k for k, v in L.PURPOSES.items()}
    rx = re.compile("|".join(re.escape(p) for p in phrase))
    purpose_of: dict[str, str] = {}
    texts = [(rec["id"].split("_")[0], next(m for m in rec["messages"] if m["type"] == "user")["content"].lower())
             for rec in tt if any(m["type"] == "user" for m in rec["messages"])]
    texts += [(t["world_user"], t["request"].lower()) for t in travel_tasks or []]
    texts += [(r["hashed_ip"], r["conversation"][0]["content"].lower()) for r in chats or []]
    for uid, text in texts:
        m = rx.search(text)
        if m and "hotel" in text:
            purpose_of.setdefault(uid, phrase[m.group(0)])
    cuisine_of: dict[str, str] = {}
    for uid, text in texts:
        m = re.search(r"food i love as an? (\w+) fan", text)
        if m:
            cuisine_of.setdefault(uid, m.group(1))
    out = {}
    for name, seen, ctx, value in (
            ("area_from_purpose", purpose_of, "purpose", lambda u: u["area"]),
            ("amenity_from_purpose", purpose_of, "purpose", lambda u: u["amenity"]),
            ("food_from_cuisine", cuisine_of, "cuisine", lambda u: u["fav"]["food"])):
        pairs = [(uid, c, value(users[uid])) for uid, c in sorted(seen.items())]
        table = [(u["uid"], u[ctx], value(u)) for u in population]
        acc, base = _cv_score(pairs, table) if pairs else (0.0, 0.0)
        out[name] = {"users": len(pairs), "accuracy": round(acc, 3), "majority_baseline": round(base, 3)}
    return out


def lengths(tt: list[dict[str, Any]]) -> dict[str, Any]:
    think, utter, turns = [], [], []
    for rec in tt:
        us = [m for m in rec["messages"] if m["type"] == "user"]
        turns.append(len(us))
        for m in us:
            think.append(len(_reason(m).split()))
            utter.append(len(m["content"].split()))
    q = lambda xs, f: sorted(xs)[min(len(xs) - 1, int(f * len(xs)))]  # noqa: E731
    return {"think_words_median": median(think), "think_words_p90": q(think, 0.9),
            "think_in_3_15": sum(3 <= x <= 15 for x in think) / len(think),
            "utterance_words_median": median(utter), "utterance_words_p90": q(utter, 0.9),
            "utterance_in_1_20": sum(1 <= x <= 20 for x in utter) / len(utter),
            "user_turns_min": min(turns), "user_turns_max": max(turns), "user_turns_median": median(turns)}


_WORD = re.compile(r"[a-z]+|\d|[^\sa-z\d]")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def word_coverage(docs: Iterable[tuple[str, str]], held_out: float = 0.1) -> float:
    """``docs``: (user id, text). Users whose id hash falls in the last ``held_out`` share are held out."""
    import hashlib

    def val(uid: str) -> bool:
        return int(hashlib.sha256(uid.encode()).hexdigest()[:8], 16) / 16 ** 8 >= 1 - held_out
    seen: set[str] = set()
    test: list[str] = []
    for uid, text in docs:
        (test.extend if val(uid) else seen.update)(_words(text))
    return sum(w in seen for w in test) / max(1, len(test))


def measure_all(root: str | Path) -> dict[str, Any]:
    """Every measure on the world written under ``root``."""
    root = Path(root)
    tt = read_jsonl(root / "thoughttrace" / "thoughttrace.jsonl")
    meta = read_jsonl(root / "world" / "thoughttrace_meta.jsonl")
    pop = read_jsonl(root / "world" / "population.jsonl")
    travel = json.loads((root / "gyms" / "travel" / "tasks.json").read_text())
    docs: list[tuple[str, str]] = []
    chats = [r for f in sorted((root / "chats").glob("*.jsonl")) for r in read_jsonl(f)]
    for r in chats:
        docs.append((r["hashed_ip"], "\n".join(m["content"] for m in r["conversation"])))
    for r in tt:
        docs.append((r["id"].split("_")[0], "\n".join(m["content"] + " " + _reason(m) for m in r["messages"])))
    return {"withholding": withholding(tt, meta), "enactment": enactment(tt, meta),
            "context_prediction": context_prediction(tt, pop, travel, chats), "lengths": lengths(tt),
            "word_coverage_held_out_users": round(word_coverage(docs), 4)}
