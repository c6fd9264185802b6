"""Draw the world and write its files: :func:`generate_world`.

Layout of ``out_dir`` (the raw inputs the existing stages read, plus a ``world/`` folder that no
stage reads: the manifest, the latent population and per-conversation annotations for analysis)::

    chats/{wildchat_travel,wildchat_shopping,wildchat_games,tom_social}.jsonl   WildChat-1M style
    thoughttrace/thoughttrace.jsonl                                             ThoughtTrace style
    abcd/abcd_v1.1.json  abcd/kb.json  abcd/guidelines.json                     ABCD v1.1 style
    gyms/<gym>/tasks.json (+ tau/db.json, search/passages.jsonl)                UserRL gym task files
    world/manifest.json  world/population.jsonl  world/thoughttrace_meta.jsonl

Every random choice comes from ``random.Random(f"{seed}:<component>:…")`` streams, so the same
seed writes byte-identical files and one component's size does not shift another's draws.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable

from mimesis_lab.behaviors import BEHAVIOR_CODES
from mimesis_lab.world import games, lexicon as L, retail, support, travel
from mimesis_lab.world.abcd_manual import GUIDELINES, KB
from mimesis_lab.world.gymtasks import gym_files
from mimesis_lab.world.params import CHAT_SOURCES, TT_DOMAINS, WorldParams
from mimesis_lab.world.population import User, sample_population
from mimesis_lab.world.style import Dialogue, Turn, plain, say

__all__ = ["generate_world", "draw_dialogue"]

STATE_NAME = {"tx": "Texas", "co": "Colorado", "ma": "Massachusetts", "wa": "Washington", "il": "Illinois",
              "fl": "Florida"}
MODELS = ("gpt-3.5-turbo-0613", "gpt-4-0314", "gpt-4-1106-preview", "gpt-4o-mini")
#: chat source -> (domain, weight) it is drawn from
SOURCE_DOMAINS = {
    "wildchat_travel": (("travel", 7), ("intention", 3)),
    "wildchat_shopping": (("support", 6), ("retail", 2), ("intention", 2)),
    "wildchat_games": (("telepathy", 3), ("turtle", 2), ("persuade", 3), ("intention", 2)),
}
TOM_CONTEXT = {"travel": "booking a hotel", "support": "talking to customer support",
               "retail": "talking to a shop", "persuade": "arguing about {claim}", "telepathy": "playing a guessing game",
               "turtle": "telling a riddle", "intention": "asking for help"}


def _rng(seed: int, *parts: Any) -> random.Random:
    return random.Random(":".join(str(p) for p in (seed, *parts)))


def _pick(rng: random.Random, weights: dict[str, float] | tuple[tuple[str, float], ...]) -> str:
    items = list(weights.items()) if isinstance(weights, dict) else list(weights)
    return rng.choices([k for k, _ in items], weights=[w for _, w in items])[0]


def _support(u: User, rng: random.Random, p: WorldParams, behavior: str | None = None,
             enact: bool | None = None) -> tuple[Dialogue, list[dict[str, str]]]:
    """A support chat; without ``behavior`` the user's own propensity decides (natural behaviour)."""
    for _ in range(8):
        sub = rng.choice(support.SUBFLOWS)
        sc = support.make_scenario(u, rng, sub, 0)
        b = behavior
        if b is None:
            tops = u.top_behaviors()
            b = tops[0] if tops and rng.random() < u.behaviors[tops[0]] * 0.6 else "N"
        kw = support.behavior_kwargs(sc, b, rng, p.behavior_turn_budget)
        if kw is not None:
            on = (b != "N") if enact is None else enact
            most = max(4, p.max_user_turns) if behavior is None else p.behavior_turn_budget  # the prompt's budget
            return support.support_dialogue(u, rng, sc, b, kw, on, rng.randint(min(4, most), most),
                                             p.behavior_turn_budget)
    sc = support.make_scenario(u, rng, support.SUBFLOWS[0], 0)
    return support.support_dialogue(u, rng, sc, "N", {}, False, max(4, p.max_user_turns), p.behavior_turn_budget)


def draw_dialogue(domain: str, u: User, rng: random.Random, p: WorldParams) -> Dialogue:
    """One conversation of ``u`` in ``domain`` (support: natural behaviour)."""
    n = rng.randint(p.min_user_turns, p.max_user_turns)
    if domain == "travel":
        return travel.travel_dialogue(u, rng, n)
    if domain == "support":
        return _support(u, rng, p)[0]
    if domain == "retail":
        db = retail.build_db([u], rng)
        task = retail.tau_tasks([u], db, rng, 1)[0]
        return retail.retail_dialogue(u, rng, task, db)
    fn: Callable = {"telepathy": games.telepathy_dialogue, "turtle": games.turtle_dialogue,
                    "persuade": games.persuade_dialogue, "intention": games.intention_dialogue}[domain]
    return fn(u, rng, n)


# ----------------------------------------------------------------------------- records

def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def chat_record(d: Dialogue, key: str, rng: random.Random) -> dict[str, Any]:
    """A WildChat-1M style record (the user's turns carry their hashed_ip = world user id)."""
    u = d.user
    t = datetime(2024, 1, 1) + timedelta(minutes=rng.randint(0, 365 * 24 * 60))
    state = STATE_NAME[u.state]
    conv = []
    turn_id = rng.randint(100_000, 999_999)
    for m in d.turns:
        t += timedelta(seconds=rng.randint(8, 90))
        content = m.content.replace(" ###STOP###", "")  # the tau protocol marker is for the instructed simulator
        user = m.role == "user"
        turn_id += user
        conv.append({"role": m.role, "content": content, "language": "English", "hashed_ip": u.uid if user else None,
                     "timestamp": _iso(t), "turn_identifier": turn_id, "toxic": False, "redacted": False,
                     "country": "United States" if user else None, "state": state if user else None})
    return {"conversation_hash": hashlib.md5(key.encode()).hexdigest(), "model": rng.choice(MODELS),
            "timestamp": conv[0]["timestamp"], "conversation": conv, "turn": d.n_user, "language": "English",
            "toxic": False, "redacted": False, "state": state, "country": "United States", "hashed_ip": u.uid}


def tt_record(d: Dialogue, cid: str, rng: random.Random) -> dict[str, Any]:
    """A ThoughtTrace style record: survey, task summary/expectation, reasons and reactions."""
    u = d.user
    t = datetime(2025, 3, 1) + timedelta(minutes=rng.randint(0, 60 * 24 * 60))
    msgs = []
    turns = [Turn("assistant", text) for text in d.opening] + d.turns
    for i, m in enumerate(turns):
        t += timedelta(seconds=rng.randint(10, 120))
        note_t = _iso(t + timedelta(seconds=rng.randint(5, 40)))
        msg: dict[str, Any] = {"id": f"m{i + 1}", "timestamp": _iso(t), "type": m.role, "content": m.content}
        if m.role == "user":
            msg["reasons"] = [{"content": m.reason, "label": "task_start" if i == len(d.opening) else "follow_up",
                               "timestamp": note_t}] if m.reason else []
        else:
            msg["reactions"] = [{"content": m.reaction, "label": "reaction", "timestamp": note_t}] if m.reaction else []
        msgs.append(msg)
    survey = {"age": u.age, "gender": u.gender, "education": u.education, "occupation": u.job.title(),
              "frequency": u.frequency, "purposes": list(u.survey_purposes)}
    return {"id": cid, "model_name": "gpt-4o", "task_summary": d.summary, "task_expectation": d.expectation,
            "survey_answers": [survey], "messages": msgs}


_3P = ((r"\bi am\b", "they are"), (r"\bi'm\b", "they're"), (r"\bi'll\b", "they'll"), (r"\bi've\b", "they've"),
       (r"\bi\b", "they"), (r"\bmy\b", "their"), (r"\bme\b", "them"), (r"\bmine\b", "theirs"))


def third_person(reason: str) -> str:
    for rx, rep in _3P:
        reason = re.sub(rx, rep, reason)
    return reason


def tom_chat(u: User, rng: random.Random, pool: list[tuple[str, str, str]], n: int) -> Dialogue:
    """Theory-of-mind talk: the user quotes what someone said; the assistant explains their unstated reason."""
    d = Dialogue(u, "tom", "", "")
    for k in range(n):
        ctx, utt, reason = rng.choice(pool)
        q = say(u, f"(my friend|my colleague|someone) said \"{{q}}\" while {ctx}. (what did they mean?|what did they "
                   "have in mind?)", rng, "question", first=k == 0, slots={"q": utt.replace("\n", " ")})
        d.u(q, "")
        d.a(plain("(i think|probably|my guess:)", rng) + f" {third_person(reason)}.")
    return d


# ----------------------------------------------------------------------------- writing

def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def _write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8", newline="\n")


def _support_plan(p: WorldParams, n: int, rng: random.Random) -> list[str]:
    k = round(p.neutral_share * n)
    rest = [BEHAVIOR_CODES[i % len(BEHAVIOR_CODES)] for i in range(n - k)]
    plan = ["N"] * k + rest
    rng.shuffle(plan)
    return plan


def generate_world(params: WorldParams, out_dir: str | Path) -> dict[str, int]:
    """Draw the world of ``params.seed`` and write it under ``out_dir``; returns rows per written file."""
    p = params
    out = Path(out_dir)
    users = sample_population(p.seed, p.users)
    counts: dict[str, int] = {}
    meta_rows: list[dict[str, Any]] = []
    pool: list[tuple[str, str, str]] = []

    def remember(d: Dialogue) -> None:
        ctx = TOM_CONTEXT[d.domain].format(claim=L.CLAIMS[d.meta["claim"]][0].rstrip(".") if "claim" in d.meta else "")
        hidden = [h.lower() for h in d.hidden if h]
        for t in d.turns:  # turns whose reason holds what the message withholds: the point of theory of mind
            if t.role == "user" and any(h in t.reason.lower() and h not in t.content.lower() for h in hidden):
                pool.append((ctx, t.content, t.reason))

    # ---- chats (mid-training)
    rng = _rng(p.seed, "chats")
    total = p.chats_per_user * len(users)
    sources = [_pick(rng, {s: w for s, w in p.chat_mix.items() if s in CHAT_SOURCES}) for _ in range(total)]
    chats: dict[str, list[dict[str, Any]]] = {s: [] for s in CHAT_SOURCES if p.chat_mix.get(s, 0) > 0}
    tom_slots = []
    for k, src in enumerate(sources):
        u = users[k % len(users)]
        r = _rng(p.seed, "chat", k)
        if src == "tom_social":
            tom_slots.append((k, u))
            continue
        d = draw_dialogue(_pick(r, SOURCE_DOMAINS[src]), u, r, p)
        remember(d)
        chats[src].append(chat_record(d, f"{p.seed}:{src}:{k}", r))
    for k, u in tom_slots:
        r = _rng(p.seed, "tom", k)
        d = tom_chat(u, r, pool, r.randint(p.min_user_turns, min(3, p.max_user_turns)))
        chats["tom_social"].append(chat_record(d, f"{p.seed}:tom_social:{k}", r))
    for src, rows in chats.items():
        _write_jsonl(out / "chats" / f"{src}.jsonl", rows)
        counts[f"chats/{src}.jsonl"] = len(rows)

    # ---- ThoughtTrace (reasoning SFT)
    rng = _rng(p.seed, "thoughttrace")
    domains = [_pick(rng, {d: w for d, w in p.thoughttrace_mix.items() if d in TT_DOMAINS})
               for _ in range(p.thoughttrace_conversations)]
    plan = iter(_support_plan(p, domains.count("support"), rng))
    tasks_of: dict[str, int] = {}
    tt_rows = []
    for k, dom in enumerate(domains):
        r = _rng(p.seed, "tt", k)
        info: dict[str, Any] = {}
        if dom == "support":
            b = next(plan)
            fans = [u for u in users if u.behaviors.get(b, 0) > 0]
            u = r.choice(fans) if fans and r.random() < 0.7 else r.choice(users)
            d, log = _support(u, r, p, behavior=b, enact=r.random() < p.enact_rate)
            info = {"behavior": d.meta["behavior"], "kwargs": d.meta["kwargs"], "enacted": d.meta["enacted"],
                    "scenario": d.meta["scenario"], "exhibit": support.exhibit(d, log)}
        else:
            u = r.choice(users)
            d = draw_dialogue(dom, u, r, p)
        tasks_of[u.uid] = tasks_of.get(u.uid, 0) + 1
        cid = f"{u.uid}_task{tasks_of[u.uid]}_conversation1"
        tt_rows.append(tt_record(d, cid, r))
        meta_rows.append({"id": cid, "domain": dom, "user": u.uid, "hidden": d.hidden, **info,
                          **{k2: v for k2, v in d.meta.items() if k2 in ("purpose", "stated", "category", "entity",
                                                                         "claim", "kind", "outcome")}})
    _write_jsonl(out / "thoughttrace" / "thoughttrace.jsonl", tt_rows)
    counts["thoughttrace/thoughttrace.jsonl"] = len(tt_rows)

    # ---- ABCD
    rng = _rng(p.seed, "abcd")
    order = list(range(len(users)))
    rng.shuffle(order)
    n_dev, n_test = round(p.abcd_dev_fraction * p.abcd_scenarios), round(p.abcd_test_fraction * p.abcd_scenarios)
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "dev": [], "test": []}
    for k in range(p.abcd_scenarios):
        u = users[order[k % len(order)]]
        r = _rng(p.seed, "abcd", k)
        d, log = _support(u, r, p)
        original = support.abcd_original(log)
        rec = {"convo_id": 1000 + k, "scenario": d.meta["scenario"], "original": original,
               "delexed": [{"speaker": s, "text": t.lower(), "turn_count": i + 1} for i, (s, t) in enumerate(original)]}
        split = "test" if k < n_test else "dev" if k < n_test + n_dev else "train"
        splits[split].append(rec)
    _write_json(out / "abcd" / "abcd_v1.1.json", {s: splits[s] for s in ("train", "dev", "test")})
    _write_json(out / "abcd" / "kb.json", KB)
    _write_json(out / "abcd" / "guidelines.json", GUIDELINES)
    counts["abcd/abcd_v1.1.json"] = p.abcd_scenarios
    counts["abcd/kb.json"] = len(KB)
    counts["abcd/guidelines.json"] = sum(len(f["subflows"]) for f in GUIDELINES.values())

    # ---- gyms
    for rel, doc in gym_files(users, p.seed, p.gym_tasks).items():
        path = out / "gyms" / rel
        if rel.endswith(".jsonl"):
            _write_jsonl(path, doc)
        else:
            _write_json(path, doc)
        counts[f"gyms/{rel}"] = len(doc["users"]) if rel == "tau/db.json" else len(doc)

    # ---- world/ (not read by any stage)
    _write_jsonl(out / "world" / "population.jsonl", [u.to_json() for u in users])
    _write_jsonl(out / "world" / "thoughttrace_meta.jsonl", meta_rows)
    files = {}
    for rel in sorted(counts):
        data = (out / rel).read_bytes()
        files[rel] = {"rows": counts[rel], "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    _write_json(out / "world" / "manifest.json", {
        "generator": "mimesis_lab.world", "synthetic": True, "params": p.model_dump(), "files": files})
    return counts
