"""The CSD validity setting (scripts/csd_validity.py, ``topic`` variant): the scripted user, the
coach's notes and the warm-start traces, all played through the real TravelGym. The GRPO-vs-CSD
runs themselves take minutes per seed and are a measurement, not a test."""
from __future__ import annotations

import json
import random
import re

from mimesis_lab.envs.gyms.base import ScriptedUser
from mimesis_lab.envs.gyms.registry import gym_for_row, load_tasks
from mimesis_lab.judges.coach import CATEGORIES
from mimesis_lab.judges.leak import find_leaks
from scripts import agent_grpo_signal as sig
from scripts import csd_validity as cv

CATS = [n for n, _ in CATEGORIES]


def _rows():
    return [sig.decode_row(r) for r in sig.travel_rows()]


def test_topic_user_keeps_preferences_private_unless_asked():
    system = "You are a traveller.\nYour private preferences:\n- Budget under $150 per night\n- Close to the beach\nEnd."
    reasoning, public = cv.topic_answer([{"role": "system", "content": system},
                                         {"role": "user", "content": cv.GENERIC_ASK}])
    assert public == cv.VAGUE
    assert "Budget under $150 per night" in reasoning and "Close to the beach" in reasoning
    _, public = cv.topic_answer([{"role": "system", "content": system},
                                 {"role": "user", "content": "What about your budget?"}])
    assert public == "Budget under $150 per night."
    # once said, a preference leaves the reasoning
    reasoning, _ = cv.topic_answer([{"role": "system", "content": system},
                                    {"role": "assistant", "content": "Budget under $150 per night."},
                                    {"role": "user", "content": "Anything else?"}])
    assert "Budget" not in reasoning and "Close to the beach" in reasoning
    raw = json.dumps({"messages": [{"role": "system", "content": system},
                                   {"role": "user", "content": "Where?"}]}).encode()
    assert re.fullmatch(r"<think>.+</think>Hmm, it depends\.", cv.topic_reply_for(raw), re.S)


def test_task_notes_name_topics_but_leak_no_preference():
    tasks = {"travel": load_tasks("travel")}
    named = 0
    for row in _rows():
        note, cats = cv.note_for_task(row, tasks)
        assert note and set(cats) <= set(CATS)
        gym = gym_for_row(row, tasks, user=ScriptedUser(lambda msgs: cv.VAGUE), rng=random.Random(0), max_steps=4)
        gym.reset()
        prefs = cv.hidden_prefs(gym.user_system_prompt())
        assert len(prefs) == 3
        assert not find_leaks(note, prefs)
        for cat in cats:
            assert re.search(rf"\b{cat}\b", note)
        named += bool(cats)
    assert named >= 8          # most tasks' notes name at least one topic: the teacher knows something


def test_instruction_notes_use_the_coach_wording_for_any_categories():
    notes = cv.instruction_notes(random.Random(0), subsets=3)
    assert [c for _, c in notes[:len(CATS)]] == [[c] for c in CATS]
    for note, cats in notes:
        assert note.startswith("Ask about their remaining preferences (")
        assert note.endswith(f"({', '.join(cats)}) before searching or answering.")
        assert cats == [c for c in CATS if c in cats]          # coach order


def test_warm_start_traces_plain_topics_are_task_blind_and_noted_ones_follow_the_note():
    rows = _rows()[:3]
    traces = cv.topic_traces(rows, plain_copies=1, subsets=1, task_note_copies=1)
    assert traces and all(t["total_reward"] > 0 for t in traces)
    for t in traces:
        msgs = t["messages"]
        q = next(i for i, m in enumerate(msgs) if m["role"] == "assistant" and "What about your" in m["content"])
        cat = re.search(r"What about your (\w+)\?", msgs[q]["content"]).group(1)
        if t["noted"]:
            assert msgs[q - 1]["role"] == "user" and re.search(rf"\b{cat}\b", msgs[q - 1]["content"])
        else:
            assert msgs[q - 1]["role"] == "tool"
    for task in {t["task_id"] for t in traces}:
        asked = {re.search(r"What about your (\w+)\?", m["content"]).group(1)
                 for t in traces if t["task_id"] == task and not t["noted"]
                 for m in t["messages"] if "What about your" in m["content"]}
        assert asked == set(CATS)     # without a note every topic is asked, whatever the task


def test_a_given_checkpoint_replaces_the_warm_start(tmp_path):
    import yaml

    ckpt = tmp_path / "my-instruct-model"
    ckpt.mkdir()
    p = sig.build(tmp_path / "run", steps=3, init_from=ckpt, traces_fn=cv.topic_traces)
    params = yaml.safe_load(p.read_text())
    assert params["agent_grpo"]["init_from"] == str(ckpt.resolve())
    assert not (tmp_path / "run" / "init").exists()
    assert json.loads((tmp_path / "run" / "warm_start.json").read_text()) == {
        "init_from": str(ckpt.resolve()), "warm_start": "none"}
