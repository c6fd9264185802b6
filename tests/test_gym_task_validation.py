"""Bad gym task files: every gym's loader rejects a task that cannot be played or would reward the wrong
answer with a ``ValueError`` naming the file, the task and the field (never a bare ``TypeError`` /
``KeyError``, never a silent accept), and the ``gyms`` stage quarantines that one task with the reason
while the good one survives.

Classes of bad input (one case per gym x class that applies): 1 unplayable (null / empty / wrong-typed
field), 2 NaN or infinite numbers, 3 an expected result that does not follow from the task's own rule,
4 a value of the wrong type (strings or booleans where numbers belong), 5 travel's option ids
(ground truth not an option, duplicate ids, options without id or price), 0 a file that is not a list
of tasks."""
from __future__ import annotations

import copy
import json
import random
import re
import shutil
from pathlib import Path

import pytest

from mimesis_lab.envs.gyms import registry, tau, turtle
from mimesis_lab.io import InputFileError, Quarantine
from stages import gyms as G
from tests.conftest import ROOT

RAW = ROOT / "data" / "raw" / "gyms"
NAN, INF = float("nan"), float("inf")
DEL = object()   # delete the field


def bundled(gym: str, i: int = 0) -> dict:
    return copy.deepcopy(json.loads((RAW / gym / "tasks.json").read_text())[i])


def patched(rec: dict, path: list, value) -> dict:
    rec = copy.deepcopy(rec)
    cur = rec
    for k in path[:-1]:
        cur = cur[k]
    if value is DEL:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return rec


def _travel_twin() -> dict:
    t = bundled("travel")
    best = next(o for o in t["options"] if o["id"] == t["best_id"])
    return dict(t, options=[*t["options"], dict(best, id="HX", name="Twin of the best")])


def _travel_wrong_best() -> dict:
    t = bundled("travel")
    return dict(t, best_id=next(o["id"] for o in t["options"] if o["id"] != t["best_id"]))


# (gym, class, what, bad record factory, text the error must contain: the field)
CASES = [
    # travel
    ("travel", 1, "options null", lambda: patched(bundled("travel"), ["options"], None), "options"),
    ("travel", 1, "options a string", lambda: patched(bundled("travel"), ["options"], "H1"), "options"),
    ("travel", 1, "options not objects", lambda: patched(bundled("travel"), ["options"], [1, 2]), "options"),
    ("travel", 1, "preference check null", lambda: patched(bundled("travel"), ["preferences", 0, "check"], None),
     "check"),
    ("travel", 1, "preference keywords null",
     lambda: patched(bundled("travel"), ["preferences", 0, "keywords"], None), "keywords"),
    ("travel", 2, "price NaN", lambda: patched(bundled("travel"), ["options", 0, "price"], NAN), "price"),
    ("travel", 2, "price infinite", lambda: patched(bundled("travel"), ["options", 0, "price"], INF), "price"),
    ("travel", 2, "check max NaN", lambda: patched(bundled("travel"), ["preferences", 0, "check", "max"], NAN),
     "max"),
    ("travel", 3, "best_id misses a preference", _travel_wrong_best, "best_id"),
    ("travel", 3, "another option also fits every preference", _travel_twin, "best_id"),
    ("travel", 4, "price a string", lambda: patched(bundled("travel"), ["options", 0, "price"], "120"), "price"),
    ("travel", 4, "price a boolean", lambda: patched(bundled("travel"), ["options", 0, "price"], True), "price"),
    ("travel", 5, "best_id not an option", lambda: patched(bundled("travel"), ["best_id"], "NOPE"), "best_id"),
    ("travel", 5, "duplicate option ids",
     lambda: patched(bundled("travel"), ["options", 1, "id"], bundled("travel")["options"][0]["id"]), "'id'"),
    ("travel", 5, "option without id", lambda: patched(bundled("travel"), ["options", 0, "id"], DEL), "'id'"),
    ("travel", 5, "option without price", lambda: patched(bundled("travel"), ["options", 0, "price"], DEL), "price"),
    # turtle
    ("turtle", 1, "surface null", lambda: patched(bundled("turtle"), ["surface"], None), "surface"),
    ("turtle", 1, "surface a number", lambda: patched(bundled("turtle"), ["surface"], 123), "surface"),
    ("turtle", 1, "bottom (solution) missing", lambda: patched(bundled("turtle"), ["solution"], DEL), "solution"),
    ("turtle", 1, "key_facts a string", lambda: patched(bundled("turtle"), ["key_facts"], "He had hiccups"),
     "key_facts"),
    ("turtle", 1, "a key fact without a content word",
     lambda: patched(bundled("turtle"), ["key_facts"], ["the", "He had hiccups"]), "key_facts"),
    ("turtle", 2, "key_fact_weights NaN", lambda: dict(bundled("turtle"), key_fact_weights=[NAN, 1, 1]),
     "key_fact_weights"),
    ("turtle", 4, "key_fact_weights booleans", lambda: dict(bundled("turtle"), key_fact_weights=[True, 1, 1]),
     "key_fact_weights"),
    # function
    ("function", 1, "rule null", lambda: patched(bundled("function"), ["rule"], None), "rule"),
    ("function", 1, "test_case null", lambda: patched(bundled("function"), ["test_case"], None), "test_case"),
    ("function", 2, "expected_result NaN", lambda: patched(bundled("function"), ["expected_result"], NAN),
     "expected_result"),
    ("function", 2, "expected_result infinite", lambda: patched(bundled("function"), ["expected_result"], INF),
     "expected_result"),
    ("function", 3, "expected_result does not follow from the rule",
     lambda: patched(bundled("function"), ["expected_result"], bundled("function")["expected_result"] + 1),
     "does not follow from the rule"),
    ("function", 4, "test_case strings", lambda: patched(bundled("function"), ["test_case"], ["2", "3", "4", "5"]),
     "test_case"),
    ("function", 4, "test_case booleans", lambda: patched(bundled("function"), ["test_case"], [True, 3, 4, 5]),
     "test_case"),
    ("function", 4, "test_case nested lists", lambda: patched(bundled("function"), ["test_case"], [[2], 3, 4, 5]),
     "test_case"),
    ("function", 4, "expected_result a boolean", lambda: patched(bundled("function"), ["expected_result"], True),
     "expected_result"),
    # tau
    ("tau", 1, "actions not a list", lambda: patched(bundled("tau"), ["actions"], "cancel"), "actions"),
    ("tau", 1, "actions an object", lambda: patched(bundled("tau"), ["actions"], {}), "actions"),
    ("tau", 1, "an action that is not an object", lambda: patched(bundled("tau"), ["actions"], [1]), "actions[0]"),
    ("tau", 1, "an action naming no tool", lambda: patched(bundled("tau"), ["actions", 0, "name"], "nuke_db"),
     "name"),
    ("tau", 1, "action kwargs a string", lambda: patched(bundled("tau"), ["actions", 0, "kwargs"], "x"), "kwargs"),
    ("tau", 1, "instruction empty", lambda: patched(bundled("tau"), ["instruction"], ""), "instruction"),
    ("tau", 1, "outputs a string", lambda: patched(bundled("tau"), ["outputs"], "refund"), "outputs"),
    ("tau", 2, "NaN in a gold action", lambda: patched(bundled("tau"), ["actions", 0, "kwargs", "amount"], NAN),
     "actions[0].kwargs.amount"),
    ("tau", 4, "user_id a number", lambda: patched(bundled("tau"), ["user_id"], 5), "user_id"),
    # persuade
    ("persuade", 1, "no claim", lambda: patched(bundled("persuade"), ["claim"], DEL), "claim"),
    ("persuade", 1, "claim null", lambda: patched(bundled("persuade"), ["claim"], None), "claim"),
    ("persuade", 1, "claim a number", lambda: patched(bundled("persuade"), ["claim"], 5), "claim"),
    ("persuade", 1, "reasons null", lambda: patched(bundled("persuade"), ["reasons"], None), "reasons"),
    ("persuade", 2, "initial_stance NaN", lambda: patched(bundled("persuade"), ["initial_stance"], NAN),
     "initial_stance"),
    ("persuade", 4, "initial_stance a boolean", lambda: patched(bundled("persuade"), ["initial_stance"], True),
     "initial_stance"),
    ("persuade", 4, "initial_stance a string", lambda: patched(bundled("persuade"), ["initial_stance"], "3"),
     "initial_stance"),
    # intention
    ("intention", 1, "options null", lambda: patched(bundled("intention"), ["missing_details", 0, "options"], None),
     "options"),
    ("intention", 1, "options a string",
     lambda: patched(bundled("intention"), ["missing_details", 0, "options"], "abc"), "options"),
    ("intention", 1, "options empty", lambda: patched(bundled("intention"), ["missing_details", 0, "options"], []),
     "options"),
    ("intention", 1, "no missing details", lambda: patched(bundled("intention"), ["missing_details"], []),
     "missing_details"),
    ("intention", 1, "category a number", lambda: patched(bundled("intention"), ["category"], 5), "category"),
    ("intention", 2, "importance NaN",
     lambda: patched(bundled("intention"), ["missing_details", 0, "importance"], NAN), "importance"),
    ("intention", 4, "importance a boolean",
     lambda: patched(bundled("intention"), ["missing_details", 0, "importance"], True), "importance"),
    # telepathy
    ("telepathy", 1, "no entity", lambda: patched(bundled("telepathy"), ["entity"], DEL), "entity"),
    ("telepathy", 1, "entity null", lambda: patched(bundled("telepathy"), ["entity"], None), "entity"),
    ("telepathy", 1, "entity a number", lambda: patched(bundled("telepathy"), ["entity"], 5), "entity"),
    ("telepathy", 1, "aliases null", lambda: patched(bundled("telepathy"), ["aliases"], None), "aliases"),
    ("telepathy", 1, "aliases a string", lambda: patched(bundled("telepathy"), ["aliases"], "Eiffel"), "aliases"),
    ("telepathy", 2, "a NaN field", lambda: dict(bundled("telepathy"), difficulty=NAN), "difficulty"),
    ("telepathy", 4, "aliases numbers", lambda: patched(bundled("telepathy"), ["aliases"], [1]), "aliases"),
    # search
    ("search", 1, "question null", lambda: patched(bundled("search"), ["question"], None), "question"),
    ("search", 1, "question empty", lambda: patched(bundled("search"), ["question"], ""), "question"),
    ("search", 1, "answer null", lambda: patched(bundled("search"), ["answer"], None), "answer"),
    ("search", 1, "answer empty list", lambda: patched(bundled("search"), ["answer"], []), "answer"),
    ("search", 1, "aliases a string", lambda: patched(bundled("search"), ["aliases"], "Eiffel"), "aliases"),
    ("search", 2, "answer NaN", lambda: patched(bundled("search"), ["answer"], NAN), "answer"),
    ("search", 4, "answer a number", lambda: patched(bundled("search"), ["answer"], 42), "answer"),
    ("search", 4, "aliases numbers", lambda: patched(bundled("search"), ["aliases"], [1]), "aliases"),
]


def _folder(tmp_path: Path, gym: str) -> Path:
    """A task folder with the gym's sibling files (search passages, tau db) beside ``tasks.json``."""
    d = tmp_path / gym
    d.mkdir()
    for f in (RAW / gym).iterdir():
        if f.name != "tasks.json":
            shutil.copy(f, d / f.name)
    return d / "tasks.json"


@pytest.mark.parametrize("gym, cls, what, make, field", CASES,
                         ids=[f"{g}-c{c}-{w.replace(' ', '_')}" for g, c, w, _, _ in CASES])
def test_bad_task_is_rejected_naming_the_field(tmp_path, gym, cls, what, make, field):
    bad = make()
    path = _folder(tmp_path, gym)
    path.write_text(json.dumps([bad]))
    with pytest.raises(ValueError, match=re.escape(field)) as err:
        registry.load_tasks(gym, path)
    assert type(err.value) is ValueError, err.value          # a named error, not a bare KeyError / TypeError
    assert str(path) in str(err.value) and str(bad["id"]) in str(err.value)
    # the gyms stage: the bad task is quarantined with that reason, the good one survives
    good = bundled(gym, 1)
    path.write_text(json.dumps([good, bad]))
    q = Quarantine()
    _, n, loaded = G.load_gym(gym, str(path), q)
    assert n == 2 and [tid for _, tid, _ in loaded] == [str(good["id"])]
    assert len(q) == 1 and q.reason[0].startswith(f"malformed task: {gym} task {str(bad['id'])!r}: ValueError")
    assert field in q.reason[0]


@pytest.mark.parametrize("gym", registry.ALL_GYMS)
@pytest.mark.parametrize("doc", [5, "tasks", None], ids=["number", "string", "null"])
def test_a_file_that_is_not_a_list_of_tasks_is_a_named_error(tmp_path, gym, doc):
    path = _folder(tmp_path, gym)
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=re.escape(str(path)) + f".*{gym} task file must be a JSON list") as err:
        registry.load_tasks(gym, path)
    assert type(err.value) is ValueError
    with pytest.raises(InputFileError, match="a task file is a JSON list"):
        G.load_gym(gym, str(path), Quarantine())


@pytest.mark.parametrize("gym", registry.ALL_GYMS)
@pytest.mark.parametrize("tid", [None, "", True], ids=["null", "empty", "bool"])
def test_a_task_without_a_usable_id_is_rejected(tmp_path, gym, tid):
    path = _folder(tmp_path, gym)
    path.write_text(json.dumps([dict(bundled(gym), id=tid)]))
    with pytest.raises(ValueError, match="'id'") as err:
        registry.load_tasks(gym, path)
    assert type(err.value) is ValueError


@pytest.mark.parametrize("gym", registry.ALL_GYMS)
def test_an_id_keyed_file_of_non_objects_is_a_named_error(tmp_path, gym):
    path = _folder(tmp_path, gym)
    path.write_text(json.dumps({"x": 5}))
    with pytest.raises(ValueError, match=re.escape(str(path))) as err:
        registry.load_tasks(gym, path)
    assert type(err.value) is ValueError
    q = Quarantine()
    _, n, loaded = G.load_gym(gym, str(path), q)
    assert n == 1 and not loaded and len(q) == 1 and q.reason[0].startswith(f"malformed task: {gym} task 'x'")


def test_tau_gold_action_that_fails_on_its_db_is_quarantined_by_the_stage(tmp_path):
    """Whether a gold action succeeds depends on the database (``gyms.tau_db``): the loader checks the
    actions' shape; building the episode replays them and names the failing one."""
    good, bad = bundled("tau", 1), patched(bundled("tau"), ["actions", 0, "kwargs", "order_id"], "#W0000")
    path = _folder(tmp_path, "tau")
    path.write_text(json.dumps([good, bad]))
    t = registry.load_tasks("tau", path)[bad["id"]]
    with pytest.raises(tau.ToolError, match=rf"{bad['id']}.*gold action 1 \(cancel_pending_order\)"):
        tau.TauGym(t)
    q = Quarantine()
    _, _, loaded = G.load_gym("tau", str(path), q)
    reasons = []
    for _, tid, task in loaded:
        try:
            G.build_task("tau", tid, task)
        except G.TaskError as e:
            reasons.append(str(e))
    assert len(reasons) == 1 and reasons[0].startswith(f"gym: tau task {bad['id']!r}") and "gold action 1" in reasons[0]


def test_inline_turtle_story_without_a_sentence_is_rejected():
    with pytest.raises(ValueError, match="'bottom'"):
        turtle.task_from_kwargs({"title": "T", "surface": "A man walks in.", "bottom": "..."})
    row = {"data_source": "interact_turtlegym", "extra_info": {"tools_kwargs": {"interact_with_env": {
        "create_kwargs": {"title": "T", "surface": "A man walks in.", "bottom": "..."}}}}}
    with pytest.raises(registry.RowError, match="malformed task.*'bottom'"):
        registry.resolve_task(row, {})


def test_bundled_and_real_task_files_still_load():
    for g in registry.ALL_GYMS:
        tasks = registry.load_tasks(g)
        assert tasks, g
        for row in registry.MODULES[g].build_rows(dict(list(tasks.items())[:2]), "test"):
            registry.gym_for_row(row, {g: tasks}, None, random.Random(0))
