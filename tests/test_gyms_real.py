"""TauGym on tau-bench's retail database with UserRL's real tau tasks, multi-aspect TravelGym, SearchGym on
a local corpus (rank-bm25) with Bamboogle's questions. Real samples under ../shared/reference-data (skipped
when absent)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mimesis_lab.config import GymsParams
from mimesis_lab.envs.gyms import registry, search, tau, travel
from mimesis_lab.envs.gyms.base import ScriptedUser
from mimesis_lab.io import InputFileError

REPO = Path(__file__).resolve().parents[1]
REF = REPO.parent / "shared" / "reference-data"
TAU_DB = REF / "tau-bench-retail"
TAU_TASKS = REF / "userrl" / "tau_train_tasks_sample.json"
BAMBOOGLE = REF / "userrl" / "search_bamboogle_sample.json"
real = pytest.mark.skipif(not (TAU_DB / "orders.json").is_file() or not TAU_TASKS.is_file() or not BAMBOOGLE.is_file(),
                          reason="../shared/reference-data is absent")


def tool(name, **kw):
    return json.dumps({"name": name, "arguments": kw})


# ------------------------------------------------------------------ tau
@pytest.fixture(scope="module")
def tau_tasks():
    return registry.load_tasks("tau", TAU_TASKS, **GymsParams(tau_db=str(TAU_DB)).task_options("tau"))


@real
def test_real_tau_oracle_scores_one_and_wrong_action_zero(tau_tasks):
    assert len(tau_tasks) == 12 and all(t["protocol"] == "userrl" for t in tau_tasks.values())
    for tid, t in tau_tasks.items():   # every real task: replaying its gold actions as the agent scores 1
        g = tau.TauGym(t, max_steps=10)
        for a in t["actions"]:          # UserRL's mapping: `answer` calls a tool
            r = g.step("answer", tool(a["name"], **a["kwargs"]))
            assert not r.done and r.info.get("db_changed") is True, (tid, r.observation)
        r = g.step("action", "###DONE###")
        assert r.done and r.reward == 1.0 and r.info["final_state_match"], tid
    t = tau_tasks["retail-train-000"]   # return 2 items of #W6067464 to credit_card_4190576; returning one is wrong
    g = tau.TauGym(t)
    g.step("answer", tool("return_delivered_order_items", order_id="#W6067464", item_ids=["9624127908"],
                          payment_method_id="credit_card_4190576"))
    r = g.step("action", "###DONE###")
    assert r.done and r.reward == 0.0 and not r.info["final_state_match"]
    assert tau.TauGym(t).step("action", "###DONE###").reward == 0.0      # doing nothing is wrong too


@real
def test_real_tau_state_changes_match_tau_bench(tau_tasks):
    db0 = tau.load_db(TAU_DB)
    order = db0["orders"]["#W7425646"]   # retail-train-005: new payment method, then an item "modified" to itself
    (pay,) = order["payment_history"]
    g = tau.TauGym(tau_tasks["retail-train-005"])
    for a in tau_tasks["retail-train-005"]["actions"]:
        g.step("answer", tool(a["name"], **a["kwargs"]))
    hist = g.db["orders"]["#W7425646"]["payment_history"]
    assert hist == [pay, {"transaction_type": "payment", "amount": pay["amount"], "payment_method_id": "credit_card_1199336"},
                    {"transaction_type": "refund", "amount": pay["amount"], "payment_method_id": pay["payment_method_id"]},
                    {"transaction_type": "refund", "amount": 0.0, "payment_method_id": "credit_card_1283450"}]
    assert g.db["orders"]["#W7425646"]["status"] == "pending (item modified)"
    # a second modification of the now "pending (item modified)" order is refused and changes nothing
    r = g.step("answer", tool("modify_pending_order_payment", order_id="#W7425646", payment_method_id="credit_card_1283450"))
    assert r.observation.startswith("Error:") and r.info["error"] == "tool_error"
    # the user-facing choices: `search tools` lists tau-bench's tools; `action` talks to the customer
    assert "modify_pending_order_items" in g.step("search", "tools").observation
    u = ScriptedUser(lambda m: "That's all, thanks! ###STOP###")
    g2 = tau.TauGym(tau_tasks["retail-train-004"], user=u)
    r = g2.step("answer", tool("find_user_id_by_name_zip", first_name="Omar", last_name="Anderson", zip="19031"))
    assert json.loads(r.observation) == "omar_anderson_3203"
    r = g2.step("action", "Is there anything else?")
    assert r.done and r.reward == 0.0 and r.info["ended_by"] == "user" and len(u.calls) == 1


@real
def test_tau_outputs_must_be_said(tau_tasks):
    t = dict(tau_tasks["retail-train-004"], actions=[])   # no change needed; an output must be said
    u = ScriptedUser(lambda m: "ok ###STOP###")
    # tau-bench removes commas from the message only: an output with a comma is never found
    r = tau.TauGym(dict(t, outputs=["1,234.5"]), user=u).step("action", "The total is 1,234.5 dollars.")
    assert r.done and r.reward == 0.0 and r.info["outputs_found"] == {"1,234.5": False}
    assert tau.outputs_found(["1234.5"], ["The total is 1,234.5 dollars."]) == {"1234.5": True}
    assert tau.outputs_found(["1234.5"], ["The total is 1234 dollars."]) == {"1234.5": False}
    r = tau.TauGym(dict(t, outputs=["1234.5"]), user=u).step("action", "The total is 1,234.5 dollars.")
    assert r.reward == 1.0
    r = tau.TauGym(dict(t, outputs=["1234.5"]), user=u).step("action", "The total is 1234 dollars.")
    assert r.reward == 0.0 and r.info["final_state_match"]


@real
def test_broken_tau_db_names_the_file(tmp_path):
    for name in ("users", "orders", "products"):
        (tmp_path / f"{name}.json").write_text((TAU_DB / f"{name}.json").read_text())
    (tmp_path / "orders.json").write_text('{"#W1": {"order_id": "#W1", ')
    with pytest.raises(InputFileError, match=r"orders\.json.*JSONDecodeError"):
        tau.load_tasks(TAU_TASKS, db=tmp_path)
    (tmp_path / "orders.json").unlink()
    with pytest.raises(InputFileError, match=r"needs orders\.json"):
        tau.load_db(tmp_path)
    # the bundled tasks on the tau-bench db: a gold action that fails names the task and the db
    t = tau.load_tasks(tau.DEFAULT_TASKS, db=TAU_DB)["tau-001"]
    with pytest.raises(tau.ToolError, match=r"tau-001.*gold action 1.*tau-bench-retail"):
        tau.TauGym(t)


# ------------------------------------------------------------------ travel
def multi_task():
    hotel = {"aspect": "hotel", "city": "Paris", "price_unit": "per night",
             "preferences": [{"text": "Has a pool", "keywords": ["pool"], "check": {"tag": "pool"}},
                             {"text": "Under $200", "keywords": ["budget"], "check": {"attr": "price", "max": 200}}],
             "options": [{"id": "H1", "name": "Pool Palace", "price": 300, "tags": ["pool"]},
                         {"id": "H2", "name": "Budget Pool Inn", "price": 150, "tags": ["pool"]},
                         {"id": "H3", "name": "Plain Stay", "price": 90, "tags": []}], "best_id": "H2"}
    car = {"aspect": "rental car", "city": "Paris", "price_unit": "per day",
           "preferences": [{"text": "Automatic gearbox", "keywords": ["automatic"], "check": {"tag": "automatic"}}],
           "options": [{"id": "C1", "name": "Stick Shift Co", "price": 30, "tags": ["manual"]},
                       {"id": "C2", "name": "Auto Drive", "price": 45, "tags": ["automatic"]}], "best_id": "C2"}
    return {"id": "hotel:1-1|rental_car:1-2", "request": "Trip to Paris: a hotel and a rental car.",
            "aspects": [hotel, car]}


def test_travel_multi_aspect_episode(tmp_path):
    f = tmp_path / "tasks.json"
    f.write_text(json.dumps([multi_task()]))
    t = travel.load_tasks(f)["hotel:1-1|rental_car:1-2"]
    (row,) = travel.build_rows({t["id"]: t}, "test")
    assert row["reward_model"]["ground_truth"] == "['H2', 'C2']" and "hotel, rental car" in row["prompt"][1]["content"]
    u = ScriptedUser(lambda m: "I need a pool.")
    g = travel.TravelGym(t, user=u, max_steps=10)
    r = g.step("search", "hotel pool")                     # lists hotel options only: 0.2 for the hotel aspect
    assert r.reward == 0.2 and "[H1]" in r.observation and "[C1]" not in r.observation
    assert g.step("search", "hotel").reward == 0.0         # hotel aspect already searched
    assert g.step("search", "rental car").reward == 0.2    # first search of the car aspect
    assert g.step("action", "What matters for the hotel?").reward == 0.2   # "pool" elicited
    r = g.step("answer", "H1")                             # meets the known pref (pool) but not the budget: 0.8
    assert (r.reward, r.done, r.info["aspect"], r.info["aspects_left"]) == (0.8, False, "hotel", ["rental car"])
    r = g.step("answer", "H2")                             # one choice per aspect
    assert (r.reward, r.done, r.info["error"]) == (0.0, False, "aspect_answered")
    r = g.step("answer", "C2")                             # best car: 1.0, and every aspect is answered
    assert (r.reward, r.done, r.info["verdict"]) == (1.0, True, "best")
    g2 = travel.TravelGym(t, user=u, max_steps=10)
    assert g2.step("answer", "C1").reward == 0.0 and not g2.done    # wrong car (no known pref): 0, go on
    assert g2.step("answer", "Budget Pool Inn").reward == 1.0 and g2.done


def test_travel_multi_aspect_task_errors(tmp_path):
    bad = multi_task()
    bad["aspects"][1]["options"][0]["id"] = "H1"
    f = tmp_path / "tasks.json"
    f.write_text(json.dumps([bad]))
    with pytest.raises(ValueError, match="repeat across aspects"):
        travel.load_tasks(f)


# ------------------------------------------------------------------ search
@real
def test_bamboogle_on_a_local_corpus(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    passages = [
        {"id": "d1", "title": "David Dinkins", "text": "David Dinkins was the first African American mayor of "
                                                      "New York City, the most populous city in the United States."},
        {"id": "d2", "title": "Citibank", "text": "Citibank was founded in 1812 as the City Bank of New York."},
        {"id": "d3", "title": "Voyager 2", "text": "Voyager 2 was launched on a Titan IIIE rocket in 1977 and is "
                                                  "the only spacecraft to have visited Uranus."},
    ]
    corpus.write_text("\n".join(json.dumps(p) for p in passages) + "\n")
    tasks = registry.load_tasks("search", BAMBOOGLE, **GymsParams(search_corpus=str(corpus)).task_options("search"))
    rep = search.corpus_report(tasks)
    # answerable: Bamboogle-2 (Titan IIIE) and -4 (David Dinkins); the other six answers are in no passage
    assert (rep["tasks"], rep["answerable"], rep["unanswerable"]) == (8, 2, 6)
    assert "Bamboogle-1" in rep["unanswerable_ids"] and "Bamboogle-4" not in rep["unanswerable_ids"]
    g = search.SearchGym(tasks["Bamboogle-4"])
    r = g.step("search", tasks["Bamboogle-4"]["question"])
    assert r.info["hits"][0] == "d1" and isinstance(g.index, search.LibraryBM25)
    r = g.step("answer", "David Dinkins")                  # the oracle: the answer is in the corpus
    assert (r.reward, r.done, r.info["outcome"]) == (1.0, True, "correct")
    assert search.SearchGym(tasks["Bamboogle-2"]).step("answer", "Saturn V").reward == 0.0
    g = search.SearchGym(tasks["Bamboogle-1"])             # James Madison: not in the corpus
    r = g.step("answer", "James Madison")
    assert (r.reward, r.done, r.info["outcome"], r.info["correct"]) == (0.0, True, "unanswerable", True)
    with pytest.raises(search.UnanswerableTask, match="unanswerable: search task 'Bamboogle-1'"):
        search.build_rows({"Bamboogle-1": tasks["Bamboogle-1"]}, "test")
    assert len(search.build_rows({k: tasks[k] for k in ("Bamboogle-2", "Bamboogle-4")}, "test")) == 2
    corpus.write_text('{"id": "x", "title": "t"}\n')
    search._index.cache_clear()
    with pytest.raises(InputFileError, match=r"corpus\.jsonl, line 1"):
        search.load_tasks(BAMBOOGLE, corpus=corpus)
