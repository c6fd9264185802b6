"""The `openai` annotator against a real local HTTP server (no mocking of httpx)."""
from __future__ import annotations

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import polars as pl
import pytest

import mimesis_lab.annotators as annotators
from mimesis_lab.annotators import ANNOTATION_SCHEMA, OpenAIAnnotator
from mimesis_lab.behaviors import validate_annotations
from mimesis_lab.config import OpenAIEndpoint

from .test_behaviors import CASES, a, tt_row, u, write_project

TURNS = [u("Write code"), a("Here is code."), u("Hurry up!!")]
VALID = {"annotations": [{"behavior": "B9", "turns": [2], "quote": "Hurry up!!", "severity": 2,
                          "rationale": "urgency without correction"}]}


def chat(content: str) -> tuple[int, str]:
    return 200, json.dumps({"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        srv.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
        status, text = srv.respond(body)
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

    def respond(body):
        return srv.script.pop(0) if len(srv.script) > 1 else srv.script[0]
    srv.respond = respond
    srv.handle_error = lambda request, client_address: None  # a client that timed out hung up: expected
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    t.start()
    srv.base_url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(annotators, "RETRY_BACKOFF_S", 0.0)


def endpoint(srv, **kw) -> OpenAIEndpoint:
    return OpenAIEndpoint(base_url=srv.base_url, model="judge-x", api_key_env="MIMESIS_TEST_KEY",
                          timeout_s=kw.pop("timeout_s", 5.0), max_retries=kw.pop("max_retries", 2), **kw)


def test_valid_answer_and_request_shape(server, monkeypatch):
    monkeypatch.setenv("MIMESIS_TEST_KEY", "sk-test")
    server.script = [chat(json.dumps(VALID))]
    with OpenAIAnnotator(endpoint(server)) as ann:
        res = ann.annotate(TURNS)
    assert res.ok and res.attempts == 1 and res.annotations == VALID["annotations"]
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == "Bearer sk-test"
    body = req["body"]
    assert body["model"] == "judge-x" and body["temperature"] == 0.0
    rf = body["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["name"] == "behavior_annotations"
    assert rf["json_schema"]["strict"] is True and rf["json_schema"]["schema"] == ANNOTATION_SCHEMA
    assert "[2] USER: Hurry up!!" in body["messages"][1]["content"]
    assert "B13" in body["messages"][0]["content"]


def test_no_authorization_header_without_key(server, monkeypatch):
    monkeypatch.delenv("MIMESIS_TEST_KEY", raising=False)
    server.script = [chat(json.dumps(VALID))]
    with OpenAIAnnotator(endpoint(server)) as ann:
        assert ann.annotate(TURNS).ok
    assert "Authorization" not in server.requests[0]["headers"]


def test_invalid_json_is_retried_then_succeeds(server):
    server.script = [chat("{not json"), chat(json.dumps(VALID))]
    with OpenAIAnnotator(endpoint(server)) as ann:
        res = ann.annotate(TURNS)
    assert res.ok and res.attempts == 2 and "not valid JSON" in res.errors[0]


@pytest.mark.parametrize("answer,needle", [
    ({"annotations": [{**VALID["annotations"][0], "behavior": "B99"}]}, "is not one of"),
    ({"annotations": [{**VALID["annotations"][0], "turns": [3]}]}, "not in 0..2"),
    ({"annotations": [{**VALID["annotations"][0], "turns": ["2"]}]}, "list of integers"),
    ({"annotations": [{**VALID["annotations"][0], "severity": 4}]}, "severity"),
    ({"annotations": [{**VALID["annotations"][0], "quote": 5}]}, "quote"),
    ({"annotations": [{**VALID["annotations"][0], "extra": 1}]}, "keys must be"),
    ({"annotations": []}, "non-empty"),
    ({"annotations": VALID["annotations"] * 2}, "twice"),
    ({"annotations": [*VALID["annotations"], {**VALID["annotations"][0], "behavior": "N"}]}, "cannot be combined"),
    ([1, 2], "exactly the key"),
])
def test_schema_violations_fail_after_retries(server, answer, needle):
    server.script = [chat(json.dumps(answer))]
    with OpenAIAnnotator(endpoint(server, max_retries=1)) as ann:
        res = ann.annotate(TURNS)
    assert not res.ok and res.annotations is None and res.attempts == 2 and len(server.requests) == 2
    assert res.error.startswith("failed after 2 attempts: schema:") and needle in res.error


def test_http_500_fails_after_bounded_retries(server):
    server.script = [(500, '{"error": "boom"}')]
    with OpenAIAnnotator(endpoint(server, max_retries=2)) as ann:
        res = ann.annotate(TURNS)
    assert not res.ok and len(server.requests) == 3
    assert res.error == 'failed after 3 attempts: HTTP 500: {"error": "boom"}'


def test_500_then_valid_recovers(server):
    server.script = [(500, "overloaded"), chat(json.dumps(VALID))]
    with OpenAIAnnotator(endpoint(server)) as ann:
        res = ann.annotate(TURNS)
    assert res.ok and res.attempts == 2


@pytest.mark.parametrize("response,needle", [
    ((200, "<html>not json</html>"), "response body is not JSON"),
    ((200, json.dumps({"choices": []})), "no choices[0].message"),
    ((200, json.dumps({"choices": [{"message": {"content": None, "refusal": "no"}}]})), "model refused"),
])
def test_malformed_bodies(server, response, needle):
    server.script = [response]
    with OpenAIAnnotator(endpoint(server, max_retries=0)) as ann:
        res = ann.annotate(TURNS)
    assert not res.ok and needle in res.error and res.attempts == 1


def test_timeout_and_connection_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ep = OpenAIEndpoint(base_url=f"http://127.0.0.1:{port}/v1", max_retries=1, timeout_s=1.0)
    with OpenAIAnnotator(ep) as ann:
        res = ann.annotate(TURNS)
    assert not res.ok and "request failed: ConnectError" in res.error and res.attempts == 2


def test_read_timeout(server):
    server.script, server.delay = [chat(json.dumps(VALID))], 0.5
    with OpenAIAnnotator(endpoint(server, timeout_s=0.1, max_retries=0)) as ann:
        res = ann.annotate(TURNS)
    assert not res.ok and "Timeout" in res.error


def test_validate_annotations_normalises():
    rows = validate_annotations({"annotations": [{"behavior": "B2", "turns": [2, 0, 2], "quote": "q" * 300,
                                                  "severity": 1, "rationale": "r"}]}, 3)
    assert rows[0]["turns"] == [0, 2] and len(rows[0]["quote"]) == 200
    with pytest.raises(ValueError, match="severity"):
        validate_annotations({"annotations": [{"behavior": "B2", "turns": [], "quote": "", "severity": True,
                                               "rationale": ""}]}, 3)


def test_stage_quarantines_annotator_failures(in_tmp, server):
    """A conversation whose annotation keeps failing is quarantined (`annotator: …`), never dropped or made N."""
    from stages.behaviors import main

    def respond(body):
        if "PLEASE FAIL" in body["messages"][1]["content"]:
            return 500, "down"
        return chat(json.dumps({"annotations": [{"behavior": "N", "turns": [], "quote": "", "severity": 1,
                                                 "rationale": "cooperative"}]}))
    server.respond = respond
    tt = [tt_row("user1_task1_conversation1", [u("hello"), a("hi")], 1),
          tt_row("user2_task1_conversation1", [u("PLEASE FAIL"), a("hi")], 7),
          tt_row("user3_task1_conversation1", CASES["B9.low_signal_pressure"], 9)]
    params = write_project(in_tmp, tt, {"train": []}, {
        "annotator": "openai",
        "openai": {"base_url": server.base_url, "model": "m", "max_retries": 1, "timeout_s": 5.0}})
    assert main(["--params", str(params), "--no-track"]) == 0
    ann = pl.read_parquet("data/processed/behavior_annotations.parquet")
    assert sorted(ann.get_column("conversation_id")) == ["user1_task1_conversation1", "user3_task1_conversation1"]
    assert set(ann.get_column("annotator")) == {"openai"}
    q = pl.read_parquet("data/quarantine/behaviors.parquet")
    assert q.height == 1 and q["row"].item() == 7 and q["source_file"].item() == "data/raw/tt.jsonl"
    assert q["reason"].item() == "annotator: failed after 2 attempts: HTTP 500: down"
    assert json.loads(q["raw"].item())["conversation_id"] == "user2_task1_conversation1"
    m = json.loads(Path("metrics/behaviors.json").read_text())
    assert (m["rows_in"], m["rows_out"], m["rows_quarantined"]) == (3, 2, 1)
    assert m["quarantine_by_reason"] == {"annotator": 1}
    assert m["behavior_frequencies"]["N"] == 2
    calls = m["annotator_calls"]          # the openai annotator's outcomes, counted by reason
    assert (calls["calls"], calls["ok"], calls["failures/http"], calls["failures_transient"]) == (3, 2, 1, 1)


# ----------------------------------------------------------------------------- many conversations at once
N_CONV = 20
# 6 of the 20 conversations (30 %) meet a fault on every attempt; 3 more fail once, then succeed
CONV_FAULTS = {"http": [0, 10], "transport": [1], "malformed": [2], "refusal": [3], "timeout": [5]}
CONV_RECOVER = [6, 16, 18]


def test_annotate_all_counts_every_injected_fault_by_reason():
    from .fake_openai import FakeOpenAI, answer, drop, raw, refuse, slow, status

    good = answer(json.dumps(VALID))
    fault_of = {"http": status(500), "transport": drop(), "malformed": raw("<html>busy</html>"), "refusal": refuse(),
                "timeout": slow(6.0, good)}

    def faults(request, attempt):
        i = int(re.search(r"conversation #(\d+)", request["body"]["messages"][1]["content"]).group(1))
        kind = next((k for k, idx in CONV_FAULTS.items() if i in idx), None)
        if kind:
            return fault_of[kind]
        return status(503) if i in CONV_RECOVER and attempt == 0 else good

    convs = [[u(f"conversation #{i}: write code"), a("Here is code."), u("Hurry up!!")] for i in range(N_CONV)]
    with FakeOpenAI(choose=faults) as server:
        with OpenAIAnnotator(OpenAIEndpoint(base_url=server.base_url, model="m", api_key_env="", timeout_s=2.0,
                                            max_retries=1), workers=8, deadline_s=60) as ann:
            t0 = time.perf_counter()
            results = ann.annotate_all(convs)
            wall = time.perf_counter() - t0
            counts = ann.tally.counts()
    failed = {i: r.reason for i, r in enumerate(results) if not r.ok}
    assert failed == {i: k for k, idx in CONV_FAULTS.items() for i in idx}            # in input order, by reason
    assert {k.removeprefix("failures/"): v for k, v in counts.items() if k.startswith("failures/")} == \
        {k: len(v) for k, v in CONV_FAULTS.items()}
    assert (counts["calls"], counts["ok"], counts["failures"]) == (N_CONV, N_CONV - 6, 6)
    assert counts["recovered_retries"] == len(CONV_RECOVER)
    assert all(r.annotations == VALID["annotations"] for r in results if r.ok)
    assert wall < 8, wall                                         # 1 timeout: 2 x 2 s


def test_annotate_all_against_a_dead_endpoint_stops_at_the_deadline():
    from .fake_openai import FakeOpenAI, slow

    convs = [[u(f"conversation #{i}"), a("ok")] for i in range(12)]
    with FakeOpenAI([slow(30.0)]) as server:
        with OpenAIAnnotator(OpenAIEndpoint(base_url=server.base_url, model="m", api_key_env="", timeout_s=60,
                                            max_retries=2), workers=4, deadline_s=1.5) as ann:
            t0 = time.perf_counter()
            results = ann.annotate_all(convs)
            wall = time.perf_counter() - t0
    assert wall < 1.5 + 2.0 + 1.0, wall                  # not 12 x 3 x 60 s
    assert all(not r.ok and r.transient and r.error.startswith("timeout: ") for r in results)
    assert {r.reason for r in results} <= {"deadline", "late"} and len(server.requests) <= 4
