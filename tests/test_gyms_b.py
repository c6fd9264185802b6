"""Gyms B: TauGym, PersuadeGym, IntentionGym, SearchGym (SPEC §3.1, DESIGN §5)."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from mimesis_lab.envs.gyms import intention, persuade, search, tau
from mimesis_lab.envs.gyms.base import GYMS, ScriptedUser, UserSideError, create_kwargs

SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference-data" / "userrl"
MODULES = {"tau": (tau, tau.TauGym), "persuade": (persuade, persuade.PersuadeGym),
           "intention": (intention, intention.IntentionGym), "search": (search, search.SearchGym)}


def user(*replies):
    """A scripted user returning ``replies`` in order (the last one repeats)."""
    it = iter(replies)
    last = [replies[-1] if replies else "ok"]

    def fn(messages):
        try:
            last[0] = next(it)
        except StopIteration:
            pass
        return last[0]
    return ScriptedUser(fn)


def call(name, **arguments):
    return json.dumps({"name": name, "arguments": arguments})


# ------------------------------------------------------------------ all gyms
@pytest.mark.parametrize("name", sorted(MODULES))
def test_bundled_tasks_parse_and_rows_are_userrl(name):
    mod, cls = MODULES[name]
    tasks = mod.load_tasks()
    assert len(tasks) >= 12 and all(tid == t["id"] for tid, t in tasks.items())
    rows = mod.build_rows(tasks, "train")
    assert len(rows) == len(tasks)
    for i, (row, (tid, task)) in enumerate(zip(rows, tasks.items())):
        assert row["data_source"] == f"interact_{name}" and row["ability"] == "interaction"
        assert [m["role"] for m in row["prompt"]] == ["system", "user"]
        assert cls.env_name in row["prompt"][0]["content"] and row["prompt"][1]["content"].strip()
        rm = row["reward_model"]
        assert (rm["env_name"], rm["id"], rm["style"]) == (cls.env_name, tid, "rule")
        assert isinstance(rm["ground_truth"], str) and rm["ground_truth"]
        info = row["extra_info"]
        assert (info["split"], info["index"], info["need_tools_kwargs"]) == ("train", i, True)
        ck = create_kwargs(row)
        assert ck["env_name"] == cls.env_name and ck["id"] == tid
        json.dumps(row)                                   # serialisable
        gym = GYMS[row["data_source"]](tasks[ck["id"]], user=user("fine"), rng=random.Random(0))
        assert gym.reset() == "" and not gym.done and gym.user_system_prompt()
        assert isinstance(gym.hidden_facts(), list)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_malformed_input_is_feedback_and_max_steps_ends(name):
    mod, cls = MODULES[name]
    task = next(iter(mod.load_tasks().values()))
    gym = cls(task, user=user("hmm. Stance: 3"), max_steps=3)
    r = gym.step("dance", "x")
    assert (r.reward, r.done, gym.steps) == (0.0, False, 1) and "unknown choice" in r.observation
    r = gym.step(None, None)                              # never raises on agent input
    assert (r.reward, r.done, gym.steps) == (0.0, False, 2)
    r = gym.step("action", "")
    assert r.done and r.info["ended_by"] == "max_steps" and gym.steps == 3
    assert gym.step("action", "again").info == {"error": "episode_done"}


@pytest.mark.parametrize("name", ["persuade", "intention", "search"])
def test_user_side_error_propagates(name):
    mod, cls = MODULES[name]
    gym = cls(next(iter(mod.load_tasks().values())), user=ScriptedUser(lambda m: ""))
    with pytest.raises(UserSideError):
        gym.step("action", "Could you tell me more?")
    with pytest.raises(UserSideError):
        cls(next(iter(mod.load_tasks().values()))).step("action", "Hello?")   # no user side at all


# ------------------------------------------------------------------ tau
def tau_task(tid):
    return tau.load_tasks()[tid]


def test_tau_correct_tool_sequence_gives_one():
    u = user("My email is emma.lopez@example.com, order #W1002.", "Yes, please cancel it.", "Thanks! ###STOP###")
    gym = tau.TauGym(tau_task("tau-001"), user=u)
    r = gym.step("answer", "Hello! Could you give me your email and the order id?")
    assert (r.reward, r.done) == (0.0, False) and "emma.lopez" in r.observation
    r = gym.step("action", call("find_user_id_by_email", email="emma.lopez@example.com"))
    assert json.loads(r.observation) == "emma_lopez_1234"
    r = gym.step("action", call("get_order_details", order_id="#W1002"))
    assert json.loads(r.observation)["status"] == "pending"
    gym.step("answer", "I will cancel #W1002 because you no longer need it. Confirm?")
    r = gym.step("action", json.dumps({"name": "cancel_pending_order",
                                       "arguments": json.dumps({"order_id": "#W1002", "reason": "no longer needed"})}))
    assert r.info["db_changed"] and r.reward == 0.0 and not r.done
    r = gym.step("answer", "Done, your order is cancelled.")
    assert r.done and r.reward == 1.0 and r.info["ended_by"] == "user" and "###STOP###" not in r.observation
    # the customer never sees tool calls: 3 agent messages, 3 replies; system prompt holds the instruction
    view = u.calls[-1]
    assert view[0]["role"] == "system" and "#W1002" in view[0]["content"] and len(view) == 6


def test_tau_wrong_write_action_gives_zero():
    gym = tau.TauGym(tau_task("tau-001"))
    gym.step("action", call("cancel_pending_order", order_id="#W1002", reason="ordered by mistake"))
    r = gym.step("answer", "###DONE###")
    assert r.done and r.reward == 0.0 and r.info["ended_by"] == "agent"
    assert r.info["db_hash"] != r.info["gold_hash"]
    gym = tau.TauGym(tau_task("tau-001"))                  # right action plus an unrequested one
    gym.step("action", call("cancel_pending_order", order_id="#W1002", reason="no longer needed"))
    gym.step("action", call("return_delivered_order_items", order_id="#W1001", item_ids=["2071"],
                            payment_method_id="credit_card_111"))
    assert gym.step("answer", "###DONE###").reward == 0.0
    assert tau.TauGym(tau_task("tau-011")).step("answer", "###DONE###").reward == 1.0   # nothing to do: no change


def test_tau_tool_errors_are_feedback():
    gym = tau.TauGym(tau_task("tau-010"))
    h0 = tau.db_hash(gym.db)
    bad = [
        call("cancel_pending_order", order_id="#W1003", reason="no longer needed"),      # delivered
        call("cancel_pending_order", order_id="#W1004", reason="too expensive"),          # bad reason
        call("modify_pending_order_address", order_id="#W1003", address1="1 A St", address2="", city="X",
             state="WA", country="USA", zip="1"),                                          # not pending
        call("return_delivered_order_items", order_id="#W1003", item_ids=["2001"], payment_method_id="paypal_221"),
        call("return_delivered_order_items", order_id="#W1003", item_ids=["2051"], payment_method_id="credit_card_111"),
        call("get_order_details", id="#W1003"),                                            # wrong argument name
        call("get_order_details", order_id="#W9999"),
        call("launch_rocket"),
        '{"name": "get_user_details", "arguments": "not json"}',
    ]
    for content in bad:
        r = gym.step("action", content)
        assert r.observation.startswith("Error:") and (r.reward, r.done) == (0.0, False), content
        assert r.info["error"] == "tool_error"
    for content in ["not json at all", "[1, 2]", '{"arguments": {}}']:
        assert gym.step("action", content).info["error"] in ("malformed_json", "malformed_call")
    assert gym.step("search", "query").info["error"] == "unsupported_choice"
    assert tau.db_hash(gym.db) == h0 and gym.steps == len(bad) + 4


def test_tau_exchange_validation():
    db = tau.load_db()
    with pytest.raises(tau.ToolError, match="not available"):
        tau.call_tool(db, "exchange_delivered_order_items", {"order_id": "#W1005", "item_ids": ["2003"],
                      "new_item_ids": ["2004"], "payment_method_id": "credit_card_331"})
    with pytest.raises(tau.ToolError, match="not a variant"):
        tau.call_tool(db, "exchange_delivered_order_items", {"order_id": "#W1005", "item_ids": ["2003"],
                      "new_item_ids": ["2071"], "payment_method_id": "credit_card_331"})
    with pytest.raises(tau.ToolError, match="gift card"):   # 49.99 -> 149.00 with a 15.00 gift card
        tau.call_tool(db, "exchange_delivered_order_items", {"order_id": "#W1008", "item_ids": ["2061"],
                      "new_item_ids": ["2063"], "payment_method_id": "gift_card_442"})
    o = tau.call_tool(db, "exchange_delivered_order_items", {"order_id": "#W1013", "item_ids": ["2001"],
                      "new_item_ids": ["2003"], "payment_method_id": "credit_card_771"})
    assert o["status"] == "exchange requested" and o["exchange_price_difference"] == 1.51
    assert tau.load_db()["orders"]["#W1013"]["status"] == "delivered"


def test_tau_db_copy_isolated_between_episodes():
    t = tau_task("tau-005")
    g1 = tau.TauGym(t)
    g1.step("action", call("cancel_pending_order", order_id="#W1010", reason="ordered by mistake"))
    assert g1.db["orders"]["#W1010"]["status"] == "cancelled"
    g2 = tau.TauGym(t)
    assert g2.db["orders"]["#W1010"]["status"] == "pending"
    assert tau.load_db()["orders"]["#W1010"]["status"] == "pending"
    assert tau.load_tasks()["tau-005"] == t and "db" not in t
    g1.reset()
    assert g1.db["orders"]["#W1010"]["status"] == "pending" and g1.steps == 0


def test_tau_all_gold_actions_replay_and_change_the_db():
    db0 = tau.db_hash(tau.load_db())
    for tid, t in tau.load_tasks().items():
        g = tau.TauGym(t)
        assert (g.gold_hash == db0) == (not t["actions"]), tid
        assert all(a["name"] in tau.WRITE_TOOLS for a in t["actions"])


def test_tau_max_steps_scores_final_state_and_hidden_facts():
    g = tau.TauGym(tau_task("tau-014"), max_steps=2)
    assert not g.step("action", call("cancel_pending_order", order_id="#W1012", reason="ordered by mistake")).done
    r = g.step("action", call("get_order_details", order_id="#W1012"))
    assert r.done and r.reward == 1.0 and r.info["ended_by"] == "max_steps"
    facts = tau.TauGym(tau_task("tau-002")).hidden_facts()
    assert "450 Pine Street" in facts and "Seattle, WA 98109" in facts and not any("#W" in f for f in facts)
    assert "color: black" in tau.TauGym(tau_task("tau-007")).hidden_facts()


# ------------------------------------------------------------------ persuade
def ptask(target="agree", initial=3):
    return {"id": "p", "claim": "Tea is better than coffee.", "initial_stance": initial, "target": target,
            "persona": "A barista.", "reasons": ["Coffee has more flavour.", "Tea is boring."]}


@pytest.mark.parametrize("text,want", [("I see. Stance: 4", 4), ("Hmm.\n**Stance:** 5/7", 5), ("Stance: **6**", 6),
                                       ("stance=2", 2), ("Stance: 3\nStance: 5.", 5), ("Stance: 9", None),
                                       ("Stance: 4.5", None), ("No number here.", None)])
def test_persuade_parse_stance(text, want):
    assert persuade.parse_stance(text) == want


def test_persuade_per_turn_rewards_hand_sequence():
    gym = persuade.PersuadeGym(ptask(), user=user("Fair. Stance: 4", "Good point! Stance: 6", "Hmm, no. Stance: 5"))
    rewards = [gym.step("action", f"argument {i}").reward for i in range(3)]
    assert rewards == pytest.approx([1 / 6, 2 / 6, -1 / 6])
    assert sum(rewards) == pytest.approx(gym.total_reward()) == pytest.approx((5 - 3) / 6)
    assert gym.history == [3, 4, 6, 5] and not gym.done
    gym = persuade.PersuadeGym(ptask("disagree", 5), user=user("Stance: 4", "Stance: 6"))
    assert [gym.step("action", "a").reward, gym.step("action", "b").reward] == pytest.approx([1 / 6, -2 / 6])


def test_persuade_unparsed_keeps_stance_and_target_end_ends():
    gym = persuade.PersuadeGym(ptask(), user=user("I won't say. ", "You convinced me. Stance: 7"))
    r = gym.step("action", "Tea has antioxidants.")
    assert (r.reward, r.done, r.info["stance_parsed"], gym.stance) == (0.0, False, False, 3)
    r = gym.step("action", "And less caffeine.")
    assert r.done and r.reward == pytest.approx(4 / 6) and r.info["ended_by"] == "target_reached"
    assert "Stance" not in r.observation and "convinced" in r.observation
    g = persuade.PersuadeGym(ptask(), user=user("Stance: 4"))
    assert "Stance: <1-7>" in g.user_system_prompt() and g.hidden_facts() == ptask()["reasons"]
    r = g.step("answer", "Thanks for chatting.")
    assert r.done and r.reward == 0.0


def test_persuade_load_rejects_bad_tasks(tmp_path):
    p = tmp_path / "t.json"
    for bad in [dict(ptask(), target="maybe"), dict(ptask(), initial_stance=7), dict(ptask(), initial_stance=0)]:
        p.write_text(json.dumps([bad]))
        with pytest.raises(ValueError):
            persuade.load_tasks(p)


# ------------------------------------------------------------------ intention
ITASK = {"id": "i1", "category": "Cooking", "task": "Give me a recipe for dinner.",
         "missing_details": [
             {"description": "Dietary restrictions", "importance": "3",
              "inquiry": "Do you have any dietary restrictions?", "options": ["Vegetarian", "Vegan"]},
             {"description": "Cooking time available", "importance": "2",
              "inquiry": "How much time do you have to cook?", "options": ["15 minutes", "One hour"]},
             {"description": "Cuisine style", "importance": "1",
              "inquiry": "Which cuisine do you prefer?", "options": ["Italian", "Thai"]}]}


def test_intention_weights_penalty_and_normalised_total():
    gym = intention.IntentionGym(ITASK, user=user("Sure."), rng=random.Random(0))
    W = 1.0 + 0.7 + 0.4
    r1 = gym.step("action", "Do you have any dietary restrictions I should know about?")
    r2 = gym.step("action", "Is it raining where you are?")                       # uncovers nothing
    r3 = gym.step("action", "Should it be Italian food?")                         # option mention
    r4 = gym.step("action", "Any dietary restrictions?")                          # already uncovered
    r5 = gym.step("action", "How much time do you have to cook tonight?")
    assert [r.reward for r in (r1, r2, r3, r4, r5)] == pytest.approx(
        [1.0 / W - 0.05, -0.05, 0.4 / W - 0.05, -0.05, 0.7 / W - 0.05])
    assert r5.done and r5.info["ended_by"] == "all_uncovered" and not r4.done
    assert sum(r.reward for r in (r1, r2, r3, r4, r5)) == pytest.approx(1.0 - 5 * 0.05) == \
        pytest.approx(gym.total_reward())
    assert r1.info["uncovered"] == "Dietary restrictions" and r2.info["uncovered"] is None
    assert intention.IMPORTANCE_WEIGHTS == {"3": 1.0, "2": 0.7, "1": 0.4} and intention.STEP_PENALTY == 0.05


def test_intention_one_detail_per_question_and_answer_ends():
    gym = intention.IntentionGym(ITASK, user=user("ok"))
    r = gym.step("action", "Vegetarian or vegan, Italian or Thai?")               # two options: best first only
    assert r.info["uncovered"] == "Dietary restrictions" and r.info["n_uncovered"] == 1
    r = gym.step("answer", "Got it.")
    assert r.done and r.reward == 0.0 and gym.total_reward() == pytest.approx(1.0 / 2.1 - 0.05)
    assert intention.match_score("Do you have any dietary restrictions?", ITASK["missing_details"][0]) >= 0.3
    assert intention.match_score("What about dessert?", ITASK["missing_details"][1]) < 0.3


def test_intention_options_drawn_from_rng_and_user_prompt():
    a = intention.IntentionGym(ITASK, rng=random.Random(7))
    b = intention.IntentionGym(ITASK, rng=random.Random(7))
    assert a.chosen == b.chosen and a.hidden_facts() == a.chosen
    assert all(c in d["options"] for c, d in zip(a.chosen, ITASK["missing_details"]))
    prompt = a.user_system_prompt()
    assert ITASK["task"] in prompt and all(f"{d['description']}: {c}" in prompt
                                           for c, d in zip(a.chosen, ITASK["missing_details"]))
    seen = {tuple(intention.IntentionGym(ITASK, rng=random.Random(s)).chosen) for s in range(20)}
    assert len(seen) > 1


@pytest.mark.skipif(not SHARED.exists(), reason="shared reference data absent")
def test_intention_loads_real_userrl_file_and_parquet_ids_resolve():
    pd = pytest.importorskip("pandas")
    tasks = intention.load_tasks(SHARED / "all_intentions_test.json")
    assert len(tasks) >= 40
    real = pd.read_parquet(SHARED / "intention_multiturn_test.parquet")
    ours = {r["reward_model"]["id"]: r for r in intention.build_rows(tasks, "test")}
    for _, row in real.iterrows():
        row = row.to_dict()
        ck = create_kwargs(row)
        assert row["data_source"] == "interact_intention" and ck["id"] in tasks
        mine = ours[ck["id"]]
        assert set(mine["reward_model"]) == set(row["reward_model"])
        assert mine["reward_model"]["ground_truth"] == row["reward_model"]["ground_truth"]
        assert create_kwargs(mine) == ck
        gym = GYMS[row["data_source"]](tasks[ck["id"]], rng=random.Random(0))
        own = gym.match(gym.details[0]["inquiry"])
        assert own == 0 and len(gym.chosen) == len(gym.details)


# ------------------------------------------------------------------ search
def test_bm25_hand_computed_and_ranking():
    bm = search.BM25(["apple banana", "apple", "cherry"])
    idf = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    norm = 1.5 * (1 - 0.75 + 0.75 * 2 / (4 / 3))
    assert bm.scores("banana") == pytest.approx([idf * 2.5 / (1 + norm), 0.0, 0.0])
    assert bm.top("apple") == [(1, pytest.approx(bm.scores("apple")[1])), (0, pytest.approx(bm.scores("apple")[0]))]
    assert bm.top("durian") == []
    gym = search.SearchGym(search.load_tasks()["search-001"])
    for query, want in [("Statue of Liberty metal framework", "Statue of Liberty"),
                        ("where do the White Nile and Blue Nile meet", "Nile"),
                        ("Linus Torvalds kernel university", "Linux"),
                        ("Apollo 11 command module name", "Apollo 11"),
                        ("first ascent K2 expedition", "K2"),
                        ("Picasso Guernica museum", "Guernica"),
                        ("capital of Brazil before 1960", "Brasília"),
                        ("chemical symbol Au", "Gold")]:
        assert gym.search(query)[0]["title"] == want, query
    assert len(search.load_passages()) >= 40


def test_search_every_task_answerable_from_top_passage():
    for tid, t in search.load_tasks().items():
        top = search.SearchGym(t).search(t["question"])[0]
        assert search.normalize_answer(t["answer"]) in search.normalize_answer(top["text"]), tid


@pytest.mark.parametrize("given,ok", [("Gustave Eiffel", True), ("gustave eiffel.", True), ("EIFFEL", True),
                                      ("The Gustave Eiffel!", True), ("Bartholdi", False),
                                      ("Gustave Eiffel built it", False), ("", False)])
def test_search_answer_normalisation(given, ok):
    assert search.answer_matches(given, search.load_tasks()["search-001"]) is ok


def test_search_episode_rewards():
    tasks = search.load_tasks()
    assert search.normalize_answer("  The L'Auto. ") == "lauto" and search.normalize_answer("Museo Reina Sofía") == \
        "museo reina sofia"
    u = user("I mean the newspaper, not the cyclists.")
    gym = search.SearchGym(tasks["search-015"], user=u)
    r = gym.step("search", "Tour de France first organised newspaper")
    assert (r.reward, r.done) == (0.0, False) and r.observation.startswith("[1] Tour de France")
    assert r.observation.count("\n\n") == 2 and r.info["hits"][0] == "p38"
    r = gym.step("action", "Do you mean who organised the race?")
    assert (r.reward, r.done) == (0.0, False) and "newspaper" in r.observation
    assert "Tour de France" in u.calls[0][0]["content"] and "L'Auto" not in u.calls[0][0]["content"]
    assert gym.step("search", "   ").info["error"] == "empty_query"
    assert gym.step("answer", "").info["error"] == "empty_answer" and not gym.done
    r = gym.step("answer", "L'Auto")
    assert r.done and r.reward == 1.0
    g = search.SearchGym(tasks["search-012"])
    assert g.step("answer", "São Paulo").reward == 0.0 and g.done
    assert search.SearchGym(tasks["search-012"]).step("answer", "rio").reward == 1.0
    assert set(search.SearchGym(tasks["search-012"]).hidden_facts()) == {"Rio de Janeiro", "Rio"}
