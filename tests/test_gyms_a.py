"""TravelGym, TurtleGym, FunctionGym, TelepathyGym: reward rules, malformed input, rows, task files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mimesis_lab.envs.gyms import function as fn
from mimesis_lab.envs.gyms import telepathy as tele
from mimesis_lab.envs.gyms import travel as trav
from mimesis_lab.envs.gyms import turtle as turt
from mimesis_lab.envs.gyms.base import GYMS, ScriptedUser, UserSideError, create_kwargs, make_gym

SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference-data" / "userrl"
MODULES = [(trav, trav.TravelGym), (turt, turt.TurtleGym), (fn, fn.FunctionGym), (tele, tele.TelepathyGym)]


def last_agent(messages):
    return messages[-1]["content"].lower()


def travel_user(messages):
    q = last_agent(messages)
    if "budget" in q and "beach" in q:
        return "Under $150 a night, and I'd love to be near the beach."
    if "budget" in q or "price" in q:
        return "I'd like to keep it under $150 per night."
    if "beach" in q or "location" in q:
        return "Somewhere close to the beach would be lovely."
    if "pet" in q or "dog" in q:
        return "Yes, my dog is coming with me."
    return "I don't mind."


@pytest.fixture
def travel1():
    return trav.load_tasks()["travel-1"]


# ---------------------------------------------------------------- TravelGym
def test_travel_elicitation_rewards_each_preference_once(travel1):
    user = ScriptedUser(travel_user)
    g = trav.TravelGym(travel1, user=user)
    r = g.step("action", "What is your budget per night?")
    assert r.reward == pytest.approx(0.2) and not r.done and "$150" in r.observation
    assert g.step("action", "Could you remind me of your budget?").reward == 0.0     # already elicited
    assert g.step("action", "Do you care about the room view?").reward == 0.0        # "I don't mind."
    assert g.step("action", "Anything about the beach?").reward == pytest.approx(0.2)
    assert g.step("action", "Travelling with a pet?").reward == pytest.approx(0.2)
    assert g.elicited == {0, 1, 2}
    # the user side sees the hidden preferences in its system prompt, the agent's message in the user slot
    view = user.calls[0]
    assert view[0]["role"] == "system" and "Budget under $150 per night" in view[0]["content"]
    assert view[-1] == {"role": "user", "content": "What is your budget per night?"}
    assert user.calls[1][2] == {"role": "assistant", "content": "I'd like to keep it under $150 per night."}


def test_travel_one_reply_can_elicit_two(travel1):
    g = trav.TravelGym(travel1, user=ScriptedUser(travel_user))
    assert g.step("action", "What's your budget, and beach or city?").reward == pytest.approx(0.4)


def test_travel_keyword_match_is_whole_word():
    assert trav.mentions("i need parking for my car", "car")
    assert not trav.mentions("i don't care", "car")
    assert trav.mentions("two bags please", "bag")
    assert trav.mentions("max $150.", "$150")


def test_travel_search_rewarded_once_when_valid(travel1):
    g = trav.TravelGym(travel1)
    r = g.step("search", "zzz qqq")
    assert r.reward == 0.0 and "No options" in r.observation
    r = g.step("search", "hotel near the beach")
    assert r.reward == pytest.approx(0.2) and "[H1]" in r.observation and "[H3]" in r.observation
    assert r.observation.index("[H1]") < r.observation.index("[H5]")       # more matches first
    assert g.step("search", "pet friendly hotel").reward == 0.0


def test_travel_answer_best(travel1):
    g = trav.TravelGym(travel1)
    r = g.step("answer", "H3")
    assert (r.reward, r.done, r.info["verdict"]) == (1.0, True, "best")
    r = trav.TravelGym(travel1).step("answer", "I recommend Casa das Ondas.")
    assert r.reward == 1.0 and r.done


def test_travel_answer_correct_and_wrong(travel1):
    g = trav.TravelGym(travel1, user=ScriptedUser(travel_user))
    g.step("action", "Near the beach?")
    r = g.step("answer", "h1")                  # beach ✓ (known), pet ✗ → correct
    assert (r.reward, r.done, r.info["verdict"]) == (0.8, True, "correct")
    g = trav.TravelGym(travel1, user=ScriptedUser(travel_user))
    g.step("action", "Beach?"), g.step("action", "Pets?")
    assert g.step("answer", "H4").reward == 0.8     # beach ✓ pet ✓ budget ✗ (not elicited)
    g = trav.TravelGym(travel1, user=ScriptedUser(travel_user))
    g.step("action", "Budget?"), g.step("action", "Beach?")
    r = g.step("answer", "H4")                  # $260 breaks the elicited budget
    assert (r.reward, r.done, r.info["verdict"]) == (0.0, True, "wrong")
    assert trav.TravelGym(travel1).step("answer", "H1").reward == 0.0   # nothing known: a blind non-best guess


def test_travel_stated_preference_is_known():
    t = trav.load_tasks()["travel-8"]
    assert trav.TravelGym(t).step("answer", "F3").reward == 0.8     # under $700 (stated), daytime
    assert trav.TravelGym(t).step("answer", "F4").reward == 0.0     # $820
    assert "Ticket under $700" not in trav.TravelGym(t).hidden_facts()


def test_travel_malformed_answers(travel1):
    g = trav.TravelGym(travel1)
    for bad in ("H9", "H1 or H3", "the cheap one"):
        r = g.step("answer", bad)
        assert r.reward == 0.0 and not r.done and r.info["error"] == "malformed_answer"
    assert g.step("answer", "H3").reward == 1.0


def test_travel_hidden_facts(travel1):
    facts = trav.TravelGym(travel1).hidden_facts()
    assert "Casa das Ondas" in facts and "Close to the beach" in facts and len(facts) == 4


def test_travel_bundled_tasks_consistent():
    tasks = trav.load_tasks()
    assert len(tasks) >= 12
    for tid, t in tasks.items():
        assert 4 <= len(t["options"]) <= 6, tid
        assert sum(not p.get("stated") for p in t["preferences"]) >= 3, tid
        full = [o["id"] for o in t["options"] if all(trav.satisfies(o, p) for p in t["preferences"])]
        assert full == [t["best_id"]], tid
        assert len({o["id"] for o in t["options"]}) == len(t["options"]), tid
        for p in t["preferences"]:
            assert p["keywords"] and any(not trav.satisfies(o, p) for o in t["options"]), (tid, p["text"])


# ---------------------------------------------------------------- TurtleGym
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


def test_turtle_gain_over_best_sequence():
    task = {"id": "t", "title": "x", "surface": "s", "solution": " ".join(WORDS), "key_facts": WORDS}
    g = turt.TurtleGym(task)
    rewards = []
    for n in (5, 3, 8):
        r = g.step("answer", " ".join(WORDS[:n]))
        rewards.append(r.reward)
        assert not r.done
    assert rewards == [pytest.approx(0.5), 0.0, pytest.approx(0.3)]
    r = g.step("answer", " ".join(WORDS))
    assert r.reward == pytest.approx(0.2) and r.done and r.info["score"] == 1.0


def test_turtle_judge_coverage():
    facts = ["He suffered from hiccups", "The gun gave him a fright"]
    assert turt.fact_covered("The gun gave him a fright", "the gun was a fright")       # 2/3 words
    assert not turt.fact_covered("The gun gave him a fright", "a gun")                  # 1/3
    assert not turt.fact_covered("He suffered from hiccups", "He had the hiccups.")     # 1/2 is not more than half
    assert turt.judge(facts, "He suffered the hiccups.") == 0.5
    # words the title and surface already show are no evidence: {gave, fright} are the fact's new words
    assert not turt.fact_covered("The gun gave him a fright", "the gun was a fright", "a man and a gun")   # 1/2
    assert turt.fact_covered("The gun gave him a fright", "it gave him a fright", "a man and a gun")       # 2/2
    assert turt.fact_covered("a gun", "the gun", "a man and a gun")    # all shown: all its words count (1/1)
    # the world's templates: the name and one frequent word are not an explanation
    kate = ["kate works as a nurse", "kate started work at dawn", "breakfast opened too late"]
    shown = "the early breakfast kate paid for breakfast at a hotel in paris every day but never ate it."
    assert turt.judge(kate, "kate's work: kate's work") == pytest.approx(1 / 3)     # without the surface: 2/3 words
    assert turt.judge(kate, "kate's work: kate's work", shown=shown) == 0.0          # {work, nurse}: 1/2
    assert turt.judge(kate, "kate works as a nurse and started work at dawn; breakfast opened too late.",
                      shown=shown) == 1.0
    assert turt.judge(facts, "The bartender ordered a drink") == 0.0
    assert turt.judge([], "anything") == 0.0


def test_turtle_actions_ask_the_host():
    t = turt.load_tasks()["turtle-1"]
    user = ScriptedUser(lambda m: "Yes")
    g = turt.TurtleGym(t, user=user)
    r = g.step("action", "Did the man have hiccups?")
    assert (r.observation, r.reward, r.done) == ("Yes", 0.0, False)
    assert t["solution"] in user.calls[0][0]["content"]
    r = g.step("answer", t["solution"])
    assert r.reward == 1.0 and r.done


def test_turtle_malformed_and_search():
    g = turt.TurtleGym(turt.load_tasks()["turtle-2"])
    for choice, content in (("search", "monopoly"), ("answer", "  "), ("guess", "x"), ("action", None)):
        r = g.step(choice, content)
        assert r.reward == 0.0 and not r.done and "error" in r.info


def test_turtle_bundled_tasks():
    tasks = turt.load_tasks()
    assert len(tasks) >= 12
    for tid, t in tasks.items():
        assert t["title"] and len(t["key_facts"]) >= 2, tid
        assert turt.judge(t["key_facts"], t["solution"]) == 1.0, tid      # the solution covers every fact
        assert turt.judge(t["key_facts"], t["solution"], shown=f"{t['title']} {t['surface']}") == 1.0, tid
        assert turt.judge(t["key_facts"], t["surface"], shown=f"{t['title']} {t['surface']}") == 0.0, tid


# ---------------------------------------------------------------- FunctionGym
@pytest.mark.parametrize("rule,vals,expected", [
    ("c * (a * b) * d", [3, 5, 5, 3], 225.0),
    ("(c - a) ** 2 / b + d", [1, 4, 7, 3], 12.0),
    ("a / b", [1, 4, 0, 0], 0.25),
    ("a ** 2 - b ** 2", [5, 3, 0, 0], 16.0),
    ("-a + b * 2", [3, 4, 0, 0], 5.0),
    ("c - b - d ** a", [2, 6, 5, 4], -17.0),
    ("c ** d ** b ** a", [3, 3, 1, 10], 1.0),           # 1 ** huge, from the real file
    ("(a + b) / c - d", [3, 4, 8, 1], -0.125),
])
def test_function_safe_eval(rule, vals, expected):
    assert fn.safe_eval(rule, vals) == pytest.approx(expected)


@pytest.mark.parametrize("rule", [
    "__import__('os').system('echo hi')", "a.real", "(1).__class__", "a[0]", "e + 1", "lambda: 1",
    "a if b else c", "a // b", "a % b", "True + a", "'s' * 3", "abs(a)", "a; b", "", "a +",
])
def test_function_safe_eval_rejects(rule):
    with pytest.raises(fn.RuleError):
        fn.safe_eval(rule, [1, 2, 3, 4])


def test_function_safe_eval_undefined():
    with pytest.raises(fn.RuleError):
        fn.safe_eval("a / (b - c)", [1, 2, 2, 0])
    with pytest.raises(fn.RuleError):
        fn.safe_eval("a ** b ** c", [10, 10, 10, 0])        # far too large


def test_function_gym_flow():
    t = fn.load_tasks()["fgym-4"]                           # (c - a) ** 2 / b + d, test [1, 4, 7, 3] → 12
    g = fn.FunctionGym(t, max_steps=20)
    r = g.step("action", "1 1 3 0")
    assert (r.reward, r.done) == (0.0, False) and r.observation.endswith("4.0")
    assert g.step("action", "1, 2, 3, 5").observation.endswith(" 7.0")
    r = g.step("answer", "12")
    assert (r.reward, r.done, r.info["error"]) == (0.0, False, "test_not_retrieved")
    r = g.step("search", "test")
    assert r.observation == "The test case is: 1 4 7 3" and r.reward == 0.0
    r = g.step("answer", "11")
    assert (r.reward, r.done) == (0.0, False)
    r = g.step("answer", "12.0000000001")
    assert (r.reward, r.done) == (1.0, True)
    assert g.step("answer", "12").done and g.step("answer", "12").reward == 0.0     # episode over


def test_function_answer_forms():
    t = fn.load_tasks()["fgym-15"]                          # expected -0.125
    for ans in ("-0.125", "-1/8", "The answer is -0.125."):
        g = fn.FunctionGym(t)
        g.step("search", "test")
        assert g.step("answer", ans).reward == 1.0, ans


def test_function_malformed_input():
    g = fn.FunctionGym(fn.load_tasks()["fgym-11"], max_steps=30)   # divides by (d - 1)
    for choice, content in (("action", "1 2 3"), ("action", "1.5 2 3 4"), ("action", "a b c d"),
                            ("action", "1 2 3 4 5"), ("action", f"{10**12} 1 1 2"), ("search", "rule"),
                            ("answer", "twelve"), ("answer", "1 2"), ("think", "x"), ("answer", None)):
        r = g.step(choice, content)
        assert r.reward == 0.0 and not r.done and "error" in r.info, (choice, content)
    r = g.step("action", "1 2 3 1")
    assert r.info["error"] == "undefined" and "division by zero" in r.observation and not r.done


def test_function_bundled_tasks_match_their_rules():
    tasks = fn.load_tasks()
    assert len(tasks) >= 12
    assert any("**" in t["rule"] for t in tasks.values()) and any("/" in t["rule"] for t in tasks.values())
    for tid, t in tasks.items():
        assert fn.safe_eval(t["rule"], t["test_case"]) == t["expected_result"], tid


def test_function_hidden_facts():
    g = fn.FunctionGym(fn.load_tasks()["fgym-1"])
    assert g.hidden_facts() == ["a + b * c - d", "9.0"]


def test_function_real_userrl_files():
    if not (SHARED / "functions.json").exists():
        pytest.skip("shared reference data absent")
    tasks = fn.load_tasks(SHARED / "functions.json")
    assert len(tasks) > 500 and tasks["func-1"]["rule"] == "c * (a * b) * d"
    for tid, t in tasks.items():
        assert fn.safe_eval(t["rule"], t["test_case"]) == pytest.approx(t["expected_result"]), tid
    pd = pytest.importorskip("pandas")
    df = pd.read_parquet(SHARED / "function_multiturn_test.parquet")
    mine = fn.build_rows(tasks, "test")[0]
    for _, row in df.iterrows():
        ck = create_kwargs(row.to_dict())
        assert ck["env_name"] == "FunctionGym" and ck["id"] in tasks
        assert row["data_source"] == fn.FunctionGym.data_source() in GYMS
        assert row["reward_model"]["ground_truth"] == str(float(tasks[ck["id"]]["expected_result"]))
    real = df.iloc[0]
    assert set(mine) == set(real.index)
    assert set(mine["reward_model"]) == set(real["reward_model"]) and set(mine["extra_info"]) == set(real["extra_info"])
    assert [m["role"] for m in mine["prompt"]] == [m["role"] for m in real["prompt"]]
    g = make_gym(real["data_source"], tasks[create_kwargs(real.to_dict())["id"]])
    g.step("search", "test")
    assert g.step("answer", real["reward_model"]["ground_truth"]).reward == 1.0


# ---------------------------------------------------------------- TelepathyGym
def test_telepathy_guesses_and_aliases():
    t = tele.load_tasks()["tele-5"]                         # Mount Everest
    g = tele.TelepathyGym(t)
    r = g.step("answer", "K2")
    assert (r.reward, r.done) == (0.0, False)
    r = g.step("answer", "Is it Mt. Everest?")
    assert (r.reward, r.done) == (1.0, True)
    for guess in ("Sagarmatha", "the mount everest", "EVEREST", "My guess is: Chomolungma."):
        assert tele.TelepathyGym(t).step("answer", guess).reward == 1.0, guess
    assert tele.TelepathyGym(t).step("answer", "Everest or K2").reward == 0.0
    assert tele.is_match("La Tour Eiffel", tele.load_tasks()["tele-1"])
    assert tele.normalise("Pokémon!") == "pokemon"


def test_telepathy_questions_and_malformed():
    t = tele.load_tasks()["tele-2"]
    user = ScriptedUser(lambda m: "Yes, it is.")
    g = tele.TelepathyGym(t, user=user)
    r = g.step("action", "Is it an animal?")
    assert (r.observation, r.reward, r.done) == ("Yes, it is.", 0.0, False)
    assert "Giraffe" in user.calls[0][0]["content"]
    for choice, content in (("search", "giraffe"), ("answer", "?!"), ("action", ""), ("ask", "x")):
        r = g.step(choice, content)
        assert r.reward == 0.0 and not r.done and "error" in r.info
    assert g.hidden_facts() == ["Giraffe", "Giraffa camelopardalis"]


# ---------------------------------------------------------------- all four
@pytest.mark.parametrize("mod,cls", MODULES)
def test_rows_userrl_format(mod, cls):
    tasks = mod.load_tasks()
    assert len(tasks) >= 12
    rows = mod.build_rows(tasks, "train")
    assert len(rows) == len(tasks)
    for i, row in enumerate(rows):
        assert row["data_source"] == f"interact_{cls.name}" and GYMS[row["data_source"]] is cls
        assert row["ability"] == "interaction"
        assert [m["role"] for m in row["prompt"]] == ["system", "user"]
        assert cls.env_name in row["prompt"][0]["content"] and "interact_with_env" in row["prompt"][0]["content"]
        rm = row["reward_model"]
        assert rm["env_name"] == cls.env_name and rm["style"] == "rule" and isinstance(rm["ground_truth"], str)
        info = row["extra_info"]
        assert (info["split"], info["index"], info["need_tools_kwargs"]) == ("train", i, True)
        ck = create_kwargs(row)
        assert ck == {"env_name": cls.env_name, "id": rm["id"]} and ck["id"] in tasks
        gym = make_gym(row["data_source"], tasks[ck["id"]])
        assert isinstance(gym, cls) and gym.reset() == ""
        shown = row["prompt"][0]["content"] + row["prompt"][1]["content"]
        for fact in gym.hidden_facts():
            assert fact not in shown, (ck["id"], fact)
    json.dumps(rows)                                        # plain JSON-serialisable


@pytest.mark.parametrize("mod,cls", MODULES)
def test_max_steps_and_episode_over(mod, cls):
    task = next(iter(mod.load_tasks().values()))
    g = cls(task, max_steps=3)
    results = [g.step("bogus", "x") for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert all(r.reward == 0.0 for r in results) and results[-1].info.get("max_steps")
    after = g.step("answer", "anything")
    assert after.done and after.reward == 0.0 and g.steps == 3


@pytest.mark.parametrize("cls,task_id", [(trav.TravelGym, "travel-1"), (turt.TurtleGym, "turtle-1"),
                                         (tele.TelepathyGym, "tele-1")])
def test_user_side_errors_propagate(cls, task_id):
    mod = {trav.TravelGym: trav, turt.TurtleGym: turt, tele.TelepathyGym: tele}[cls]
    task = mod.load_tasks()[task_id]
    with pytest.raises(UserSideError):
        cls(task).step("action", "Is it big?")                           # no user side
    with pytest.raises(UserSideError):
        cls(task, user=ScriptedUser(lambda m: "  ")).step("action", "Is it big?")
