"""Privacy over many episodes (issue 5 target): across 240 episodes of all eight gyms, driven by a
scripted agent that asks, searches and answers, with the user side behind the real privileged shim
and a simulator whose every reply carries episode-specific private reasoning, no token sequence of
that reasoning ever appears in any agent input — while every reasoning is stored, turn-aligned,
for its own episode only."""
from __future__ import annotations

import json
import random
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mimesis_lab.envs.gyms.registry import ALL_GYMS, MODULES, gym_for_row, load_tasks
from mimesis_lab.rollout.agent_rollout import run_agent_episodes
from mimesis_lab.rollout.backends import Generation, SamplingParams
from mimesis_lab.rollout.shim import PrivilegedShim
from mimesis_lab.rollout.user_side import EndpointUser

pytestmark = pytest.mark.slow


class _Sim(BaseHTTPRequestHandler):
    """The simulator: reasoning = a secret derived from the episode's own conversation."""

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        last = body["messages"][-1]["content"]
        tag = re.sub(r"[^a-z0-9]", "", last.lower())[:12]
        secret = f"private-{tag}-{abs(hash(json.dumps(body['messages']))) % 10**9} I will reveal slowly"
        content = f"<think>{secret}</think>Hmm, maybe. Stance: 4"
        out = json.dumps({"id": "x", "object": "chat.completion", "model": "sim", "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


class _SimServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512    # a round's user turns arrive at once (concurrent gym steps): the default
                                # listen backlog of 5 would reset connections, unlike a real server's


class _Agent:
    """A scripted agent (backend double) emitting varied tool calls, tokenised like a model's."""

    def __init__(self, tok, rng):
        self.tok, self.rng = tok, rng

    def generate_ids(self, prompts, params):
        out = []
        for p in prompts:
            text = self.rng.choice(["[action] Do you prefer the beach or the city?", "[action] Is it alive?",
                                    '[action] {"name": "get_user_details", "arguments": {"user_id": "u1"}}',
                                    "[search] hotel beach", "[search] test", "[answer] 42", "[action] 1 2 3 4"])
            ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
            out.append(Generation(list(p), ids, [-1.0] * len(ids), self.tok.decode(ids), "stop"))
        return out


def test_no_reasoning_ever_reaches_the_agent():
    from mimesis_lab.tokenizer import train_tokenizer

    tasks = {g: load_tasks(g) for g in ALL_GYMS}
    rows = [r for g in ALL_GYMS for r in MODULES[g].build_rows(tasks[g], "train")]
    tok = train_tokenizer([m["content"] for r in rows for m in r["prompt"]], vocab_size=2000, min_frequency=1)
    sim = _SimServer(("127.0.0.1", 0), _Sim)
    threading.Thread(target=sim.serve_forever, daemon=True).start()
    shim = PrivilegedShim(f"http://127.0.0.1:{sim.server_port}/v1", max_episodes=64)
    shim.start()
    rng = random.Random(0)
    checked = stored = 0
    try:
        for batch in range(6):
            picks = [rows[rng.randrange(len(rows))] for _ in range(40)]
            ids = [(f"b{batch}g{i // 4}", f"b{batch}e{i}") for i in range(len(picks))]
            users = [EndpointUser(shim.url, "sim", episode=t, sampling=SamplingParams(max_new_tokens=16),
                                  timeout_s=30, max_retries=0) for _, t in ids]
            gyms = [gym_for_row(r, tasks, u, random.Random(i), max_steps=4) for i, (r, u) in enumerate(zip(picks, users))]
            trajs = run_agent_episodes(picks, gyms, ids, _Agent(tok, rng), tok, SamplingParams(max_new_tokens=32),
                                       max_turns=4, check_every_turn=True)
            for t, u in zip(trajs, users):
                try:
                    secrets = shim.privileged(t.traj_id)
                except KeyError:
                    secrets = []
                stream = tok.decode(t.ids, skip_special_tokens=False)
                for s in secrets:
                    assert s.startswith("private-") and s not in stream, t.traj_id
                    assert s.split(" ")[0] not in stream        # not even its unique first token run
                assert "<think>" not in "".join(m["content"] for m in t.messages if m["role"] == "tool")
                assert t.invalid in (None, "user_error", "timeout", "env_error"), (t.invalid, t.invalid_detail)
                stored += len(secrets)
                checked += 1
                shim.delete(t.traj_id)
                u.close()
        st = shim.stats()
    finally:
        shim.stop()
        sim.shutdown()
    assert checked == 240 and stored >= 100, (checked, stored)
    assert st["live_episodes"] == 0 and st["upstream_errors"] == 0
