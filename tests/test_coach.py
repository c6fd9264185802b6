"""CSD coach (SPEC §3.3 item 3): template cues, prompt styles, note parsing, the OpenAI coach against
a real local HTTP stub (no mocking of httpx), and the separate-endpoint precheck."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mimesis_lab.config import OpenAIEndpoint
from mimesis_lab.envs.gyms.registry import ALL_GYMS, load_tasks
from mimesis_lab.judges.coach import (
    MAX_NOTE_CHARS,
    CoachInput,
    OpenAICoach,
    TemplateCoach,
    action_note,
    check_coach_endpoint,
    coach_messages,
    make_coach,
    parse_note,
)
from mimesis_lab.judges.leak import find_leaks, private_facts

HISTORY = [{"role": "system", "content": "You help travellers."},
           {"role": "user", "content": "I need a hotel in Lisbon."}]
REPLY = "ZZ-SECRET-REPLY-[action] Which area?"


def inp(reasoning: str = "", nxt: str = "", reply: str = REPLY) -> CoachInput:
    return CoachInput(history=list(HISTORY), reasoning=reasoning, next_utterance=nxt, reply=reply, gym="travel")


# ---- template coach ------------------------------------------------------------------------------

def test_template_none_when_nothing_to_say():
    res = TemplateCoach().coach(inp())
    assert res.status == "none" and res.note is None
    assert TemplateCoach().coach(inp("I am thinking.", "Okay.")).status == "none"


@pytest.mark.parametrize("reasoning, nxt, cue, phrase", [
    ("", "Which of these has a pool?", "question", "answer the user's question first"),
    ("", "No, that's not what I asked for.", "negative", "change approach"),
    ("The assistant keeps repeating itself, frustrating.", "Hmm.", "negative", "do not repeat"),
    ("The assistant hasn't asked about my budget yet; I must stay cheap.", "Sure.", "unmet", "remaining preferences"),
    ("Great, they found it.", "Sounds good, go ahead.", "ready", "final answer now"),
    ("The search returned no results.", "", "failed", "try a different action"),
])
def test_template_cues(reasoning, nxt, cue, phrase):
    coach = TemplateCoach()
    x = inp(reasoning, nxt)
    assert cue in coach.cues(x)
    res = coach.coach(x)
    assert res.status == "ok" and phrase in res.note.lower()


def test_template_names_categories_never_values():
    x = inp("He hasn't asked about my budget of $150 or my dog; I prefer the beach.", "What do you need?")
    res = TemplateCoach().coach(x)
    assert res.status == "ok"
    assert "budget" in res.note and "location" in res.note and "amenities" in res.note
    for secret in ("150", "dog", "beach", "$"):
        assert secret not in res.note
    assert res.note.index("question") < res.note.index("preferences")   # fixed cue order


def test_template_ready_suppresses_unmet_and_negative_suppresses_ready():
    c = TemplateCoach()
    assert c.cues(inp("I prefer nothing else, that's all.", "Sounds good.")) == ["ready"]
    assert "ready" not in c.cues(inp("", "No, that does not sound good."))


def test_template_deterministic_and_corrective_sees_reply():
    x = inp("I need parking.", "Is breakfast included?", reply="I think the best hotel is the first one.")
    assert TemplateCoach().coach(x) == TemplateCoach().coach(x)
    assert "interact_with_env" not in TemplateCoach().coach(x).note
    assert TemplateCoach("corrective").coach(x).note.startswith("Call the interact_with_env tool")
    assert not TemplateCoach("corrective").coach(inp("I need parking.", "", reply="[search] hotel")).note.startswith(
        "Call")
    with pytest.raises(ValueError, match="style"):
        TemplateCoach("hindsight")


def test_template_notes_never_leak_on_bundled_tasks():
    """Every cue fired at once: the template vocabulary is clean against every gym's private facts."""
    x = inp("The assistant's search failed; I'm frustrated. He hasn't asked about my budget, the beach, my dog, "
            "dates, rating, kids or the train.", "No, which one has a pool?")
    note = TemplateCoach("corrective").coach(CoachInput(**{**x.__dict__, "reply": "plain text"})).note
    for gym in ALL_GYMS:
        for task in load_tasks(gym).values():
            assert find_leaks(note, private_facts(gym, task)) == [], (gym, task.get("id"))


def test_action_note_recommends_the_action_in_the_coachs_own_sentences():
    """Warm-start notes (agent_traces.coached_share) are sentences the template coach writes in RL."""
    # a question to the user: `unmet`, naming the categories of the question and of the user's answer
    assert action_note("action", "Do you have a budget in mind?", "price under $100 per night.") == \
        "Ask about their remaining preferences (budget, dates) before searching or answering."   # "night": dates
    assert action_note("action", "Is parking important to you?", "has good wifi.") == \
        "Ask about their remaining preferences (amenities) before searching or answering."
    assert action_note("action", "Is yuki training for something?", "Yes") == \
        "Ask about their remaining preferences before searching or answering."
    # the final answer: `ready`
    assert action_note("answer", "H2") == "The user is ready: give the final answer now."
    # a search or an argument: no template note recommends it
    assert action_note("search", "hotel in madrid") is None
    assert action_note("action", "I understand: you like your privacy. That is a fair concern.") is None
    # the same sentences the coach writes from a user's reasoning (so the agent learns the RL vocabulary)
    coached = TemplateCoach().coach(inp("I want it under $200 but they have not asked about the budget")).note
    assert coached == action_note("action", "What is your budget?", "")
    assert TemplateCoach().coach(inp("", "sounds good, go ahead")).note == action_note("answer", "H1")


# ---- prompt and parsing --------------------------------------------------------------------------

def test_prospective_prompt_excludes_reply_corrective_includes_it():
    x = inp("I want a quiet place.", "Is it near the sea?")
    pro = json.dumps(coach_messages(x, "prospective"))
    cor = json.dumps(coach_messages(x, "corrective"))
    assert "ZZ-SECRET-REPLY" not in pro and "ZZ-SECRET-REPLY" in cor
    for text in (pro, cor):
        assert "I want a quiet place." in text and "Is it near the sea?" in text and "NONE" in text
        assert "budgets" in text and "preferences" in text and "the answer" in text
    with pytest.raises(ValueError):
        coach_messages(x, "other")


def test_prompt_says_reasoning_absent_and_limits_history():
    history = [{"role": "user", "content": f"message {i} " + "x" * 80} for i in range(50)]
    msgs = coach_messages(CoachInput(history, "", "", "", "turtle"), max_history_chars=400)
    body = msgs[1]["content"]
    assert "absent" in body.split("private reasoning")[1][:80]
    assert "message 49" in body and "message 0 " not in body and "earlier message(s) omitted" in body
    conv = body.split("\n\n")[0]
    assert len(conv) < 400 + 100


def test_parse_note_cut_and_none():
    assert parse_note("  " + "a" * 1000).note == "a" * MAX_NOTE_CHARS
    for s in ("NONE", "none.", " None! ", "**NONE**", "", "   ", "<think>hmm</think>NONE"):
        assert parse_note(s).status == "none", s
    ok = parse_note("<think>private</think>  Ask about timing. ")
    assert ok.status == "ok" and ok.note == "Ask about timing."
    assert parse_note("None of the options fit; ask again.").status == "ok"
    assert parse_note(None).status == "failure"


# ---- OpenAI coach against a local stub ----------------------------------------------------------

def chat(content) -> tuple[int, str]:
    return 200, json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        srv.requests.append({"path": self.path, "body": body})
        status, text = srv.script.pop(0) if len(srv.script) > 1 else srv.script[0]
        if srv.delay:
            time.sleep(srv.delay)
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.requests, srv.script, srv.delay = [], [], 0.0
    srv.handle_error = lambda request, client_address: None   # a client that timed out hung up: expected
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    t.start()
    srv.base_url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    yield srv
    srv.shutdown()
    srv.server_close()


def coach_for(srv, style="prospective", **kw) -> OpenAICoach:
    ep = OpenAIEndpoint(base_url=srv.base_url, model="coach-x", api_key_env="MIMESIS_TEST_COACH_KEY",
                        timeout_s=kw.pop("timeout_s", 5.0), max_retries=kw.pop("max_retries", 2))
    return OpenAICoach(ep, style=style, backoff_s=0.0)


def test_openai_ok_and_request_shape(server):
    server.script = [chat("  Ask about their preferred location before searching. ")]
    coach = coach_for(server)
    res = coach.coach(inp("I like quiet places.", "Where is it?"))
    coach.close()
    assert res.status == "ok" and res.note == "Ask about their preferred location before searching."
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["body"]["model"] == "coach-x"
    assert "ZZ-SECRET-REPLY" not in json.dumps(req["body"]["messages"])


def test_openai_none_and_long_note(server):
    server.script = [chat("NONE."), chat("b" * 900)]
    coach = coach_for(server, style="corrective")
    assert coach.coach(inp()).status == "none"
    res = coach.coach(inp())
    assert res.status == "ok" and len(res.note) == MAX_NOTE_CHARS
    assert "ZZ-SECRET-REPLY" in json.dumps(server.requests[-1]["body"]["messages"])
    assert len(server.requests) == 2   # NONE is an answer, not retried


def test_openai_http_500_fails_after_retries(server):
    server.script = [(500, '{"error": "boom"}')]
    res = coach_for(server, max_retries=2).coach(inp())
    assert res.status == "failure" and res.note is None and "HTTP 500" in res.detail
    assert len(server.requests) == 3


def test_openai_malformed_then_recovers_and_malformed_fails(server):
    server.script = [(200, "not json"), chat("Ask about dates.")]
    assert coach_for(server, max_retries=1).coach(inp()).note == "Ask about dates."
    server.script = [(200, json.dumps({"choices": []}))]
    res = coach_for(server, max_retries=1).coach(inp())
    assert res.status == "failure" and "chat completion" in res.detail


def test_openai_timeout_is_failure(server):
    server.script, server.delay = [chat("late")], 0.5
    t0 = time.perf_counter()
    res = coach_for(server, timeout_s=0.1, max_retries=1).coach(inp())
    assert res.status == "failure" and "timeout" in res.detail.lower()
    assert time.perf_counter() - t0 < 3.0


def test_openai_unreachable_is_failure():
    ep = OpenAIEndpoint(base_url="http://127.0.0.1:9/v1", timeout_s=1.0, max_retries=0)
    res = OpenAICoach(ep, backoff_s=0.0).coach(inp())
    assert res.status == "failure" and "request failed" in res.detail


def test_make_coach():
    assert isinstance(make_coach("template", None, "prospective"), TemplateCoach)
    c = make_coach("openai", OpenAIEndpoint(), "corrective")
    assert isinstance(c, OpenAICoach) and c.style == "corrective"
    c.close()
    with pytest.raises(ValueError, match="kind"):
        make_coach("gpt", None, "prospective")
    with pytest.raises(ValueError, match="endpoint"):
        make_coach("openai", None, "prospective")


# ---- endpoint precheck ---------------------------------------------------------------------------

@pytest.mark.parametrize("coach, forbidden", [
    ("http://127.0.0.1:8000/v1", ["http://localhost:8000/ep/x/v1"]),
    ("http://localhost:8000/v1", ["http://127.0.0.1:8000"]),
    ("https://[::1]:8000/v1", ["http://0.0.0.0:8000/v1"]),
    ("http://sim.example:80/v1", ["http://other:1/v1", "http://SIM.example/ep/3/v1"]),
    ("https://sim.example/v1", ["sim.example:443/shim"]),
])
def test_check_coach_endpoint_rejects_same_server(coach, forbidden):
    with pytest.raises(ValueError, match="pollute the user-reasoning buffer"):
        check_coach_endpoint(coach, forbidden)


def test_check_coach_endpoint_accepts_other_server():
    check_coach_endpoint("http://127.0.0.1:8001/v1", ["http://localhost:8000/v1", "http://127.0.0.1:8002/ep/a/v1"])
    check_coach_endpoint("http://coach.example/v1", ["http://sim.example/v1"])
    check_coach_endpoint("http://127.0.0.1:8001/v1", [])
    with pytest.raises(ValueError, match="host"):
        check_coach_endpoint("http:///v1", [])


def test_openai_failures_are_counted_by_reason_from_a_thread_pool():
    """As the CSD post-pass calls it: 20 turns on 8 threads, 30 % of them meet a fault on every attempt,
    3 more fail once then succeed. Every failure is counted by its reason, every recovery summed."""
    import re
    from concurrent.futures import ThreadPoolExecutor

    from .fake_openai import FakeOpenAI, answer, drop, raw, refuse, slow, status

    plan = {"http": [0, 10], "transport": [1], "malformed": [2], "refusal": [3], "timeout": [5]}
    recover = [6, 16, 18]
    fault_of = {"http": status(502), "transport": drop(), "malformed": raw("busy"), "refusal": refuse(),
                "timeout": slow(6.0, answer("late"))}

    def faults(request, attempt):
        i = int(re.search(r"turn #(\d+)", request["body"]["messages"][1]["content"]).group(1))
        kind = next((k for k, idx in plan.items() if i in idx), None)
        if kind:
            return fault_of[kind]
        return status(503) if i in recover and attempt == 0 else answer("Ask about dates." if i % 2 else "NONE")

    with FakeOpenAI(choose=faults) as server:
        coach = OpenAICoach(OpenAIEndpoint(base_url=server.base_url, model="c", api_key_env="", timeout_s=2.0,
                                           max_retries=1), backoff_s=0.0)
        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(lambda i: coach.coach(inp("z", f"turn #{i}: when?")), range(20)))
        counts = coach.failure_counts(reset=True)
        coach.close()
    assert {i: r.reason for i, r in enumerate(results) if r.status == "failure"} == \
        {i: k for k, idx in plan.items() for i in idx}
    assert {k.removeprefix("failures/"): v for k, v in counts.items() if k.startswith("failures/")} == \
        {k: len(v) for k, v in plan.items()}
    assert (counts["calls"], counts["ok"], counts["failures"], counts["failures_transient"]) == (20, 14, 6, 4)
    assert counts["recovered_retries"] == 3
    assert coach.failure_counts()["calls"] == 0                     # reset: the next step starts at 0
    assert TemplateCoach().failure_counts() == {"calls": 0, "ok": 0, "failures": 0, "failures_transient": 0,
                                                "recovered_retries": 0}
