"""SearchGym: answer a factual question with a local search index (SPEC §3.1, DESIGN §5).

Instead of a web search API, the gym searches a small local corpus
(``data/raw/gyms/search/passages.jsonl``: ``{id, title, text}``) with BM25 (``k1 = 1.5``,
``b = 0.75``, idf ``ln(1 + (N − df + 0.5) / (df + 0.5))``), implemented here. Task:
``{id, question, answer, aliases}``.

* ``search`` — ``content`` is a query; the observation lists the top-3 passages (title + text),
  reward 0, not done. An empty query (or one of only stop words) is feedback.
* ``answer`` — the final answer: reward **1.0 if it equals the answer or an alias after
  normalisation** (Unicode accents removed, lower-case, punctuation removed, the articles a / an /
  the removed, white space collapsed — SQuAD style), else 0.0; the episode ends.
* ``action`` — a message to the user (:meth:`Gym.ask_user`), who only knows the question;
  allowed, reward 0.

Done on ``answer`` or after ``max_steps`` steps (reward 0 then).
"""
from __future__ import annotations

import json
import math
import re
import string
import unicodedata
from collections import Counter
from functools import lru_cache
from pathlib import Path

from mimesis_lab.envs.gyms.base import CHOICES, Gym, StepResult, register_gym

__all__ = ["SearchGym", "BM25", "DEFAULT_TASKS", "DEFAULT_PASSAGES", "load_tasks", "load_passages", "build_rows",
           "normalize_answer", "answer_matches", "TOP_K"]

DATA_DIR = Path(__file__).resolve().parents[3] / "data" / "raw" / "gyms" / "search"
DEFAULT_TASKS = DATA_DIR / "tasks.json"
DEFAULT_PASSAGES = DATA_DIR / "passages.jsonl"
TOP_K = 3

_STOP = set("""a an the and or but of to in on at for with about as by from into is are was were be been being
do does did this that these those it its which who whom whose what when where why how there than then so
i me my we our you your he she they them their his her has have had not no""".split())


def _fold(text: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKD", text or "") if not unicodedata.combining(c)).lower()


def tokenize(text: str) -> list[str]:
    """Lower-cased, accent-folded ``[a-z0-9]+`` tokens without stop words, plural ``s`` stripped."""
    out = []
    for w in re.findall(r"[a-z0-9]+", _fold(text)):
        if w in _STOP:
            continue
        out.append(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w)
    return out


class BM25:
    """Okapi BM25 over a list of documents (strings)."""

    def __init__(self, docs: list[str], k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = k1, b
        self.tfs = [Counter(tokenize(d)) for d in docs]
        self.lens = [sum(tf.values()) for tf in self.tfs]
        self.n = len(docs)
        self.avgdl = (sum(self.lens) / self.n) if self.n else 0.0
        df: Counter = Counter()
        for tf in self.tfs:
            df.update(tf.keys())
        self.idf = {w: math.log(1.0 + (self.n - f + 0.5) / (f + 0.5)) for w, f in df.items()}

    def scores(self, query: str) -> list[float]:
        q = tokenize(query)
        out = []
        for tf, dl in zip(self.tfs, self.lens):
            s = 0.0
            norm = self.k1 * (1 - self.b + self.b * dl / self.avgdl) if self.avgdl else self.k1
            for w in q:
                f = tf.get(w, 0)
                if f:
                    s += self.idf[w] * f * (self.k1 + 1) / (f + norm)
            out.append(s)
        return out

    def top(self, query: str, k: int = TOP_K) -> list[tuple[int, float]]:
        """The ``k`` best ``(doc index, score)`` with score > 0, best first (ties → lower index)."""
        sc = self.scores(query)
        order = sorted(range(self.n), key=lambda i: (-sc[i], i))
        return [(i, sc[i]) for i in order[:k] if sc[i] > 0]


def load_passages(path: str | Path = DEFAULT_PASSAGES) -> list[dict]:
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            p = json.loads(line)
            for k in ("id", "title", "text"):
                if k not in p:
                    raise ValueError(f"{path}: passage without {k!r}: {p}")
            out.append(p)
    return out


@lru_cache(maxsize=4)
def _index(path: str) -> tuple[tuple[dict, ...], BM25]:
    passages = load_passages(path)
    return tuple(passages), BM25([f"{p['title']} {p['text']}" for p in passages])


def load_tasks(path: str | Path = DEFAULT_TASKS) -> dict[str, dict]:
    """Tasks by id; each gets ``passages_path`` (the sibling ``passages.jsonl``) unless it names its own."""
    path = Path(path)
    out: dict[str, dict] = {}
    for t in json.loads(path.read_text()):
        for k in ("id", "question", "answer"):
            if k not in t:
                raise ValueError(f"{path}: search task without {k!r}: {t}")
        t = dict(t, aliases=list(t.get("aliases") or []))
        t.setdefault("passages_path", str(path.parent / "passages.jsonl"))
        out[str(t["id"])] = t
    return out


def normalize_answer(text: str) -> str:
    s = _fold(text)
    s = "".join(c for c in s if c not in set(string.punctuation) | {"‘", "’", "“", "”", "–", "—"})
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def answer_matches(answer: str, task: dict) -> bool:
    got = normalize_answer(answer)
    return bool(got) and any(got == normalize_answer(a) for a in [task["answer"], *task.get("aliases", [])])


SYSTEM_PROMPT = """You are an agent that interacts with an environment through a tool. Below are the environment, your action space and some notes.

- Environment Description: SearchGym gives you a factual question from a user. You can search a document collection to find the answer, then give your final answer.

- Action Space: call the tool `interact_with_env` with `choice` one of `search`, `answer`, `action`.

- Action Description:
  * `search`: put a search query in `content`; the three most relevant passages come back.
  * `answer`: put your final answer in `content`: only the answer itself (a name, a number, a short phrase), not a sentence. This ends the episode; the answer is checked against the correct one.
  * `action`: send a message to the user in `content` (for example to clarify the question); the user only knows the question, not the answer.

- Important Notes:
  * Write your reasoning between `<think>` and `</think>` before each tool call.
  * Prefer short keyword queries; if the passages do not contain the answer, rephrase the query.
  * You answer only once, and the number of steps is limited."""


def build_rows(tasks: dict[str, dict], split: str) -> list[dict]:
    rows = []
    for i, (tid, t) in enumerate(tasks.items()):
        user_msg = f"The user's question: {t['question']}\nFind the answer with the search tool and answer it."
        rows.append(SearchGym.userrl_row(tid, SYSTEM_PROMPT, user_msg, t["answer"], split, i))
    return rows


USER_PROMPT = """You are a person who asked an AI assistant this question: "{question}"

You do not know the answer and have no extra information about it. If the assistant asks you something, reply briefly and naturally: you may rephrase or explain what you mean by the question, but never guess or suggest an answer."""


@register_gym
class SearchGym(Gym):
    name = "search"
    env_name = "SearchGym"

    def setup(self) -> None:
        self.passages, self.index = _index(str(Path(self.task.get("passages_path") or DEFAULT_PASSAGES).resolve()))

    def reset_state(self) -> str:
        self.queries: list[str] = []
        return ""

    def search(self, query: str, k: int = TOP_K) -> list[dict]:
        return [dict(self.passages[i], score=round(s, 4)) for i, s in self.index.top(query, k)]

    def step(self, choice: str, content: str) -> StepResult:
        if self.done:
            return StepResult("The episode has already ended.", 0.0, True, {"error": "episode_done"})
        self.steps += 1
        ch = choice.strip().strip("[]").lower() if isinstance(choice, str) else ""
        text = content.strip() if isinstance(content, str) else ""
        reward, info = 0.0, {}
        if ch == "search":
            hits = self.search(text) if text else []
            if not text:
                obs, info = "Error: `search` needs a query in `content`.", {"error": "empty_query"}
            elif not hits:
                obs, info = "No passage matches this query; try other keywords.", {"hits": []}
            else:
                self.queries.append(text)
                obs = "\n\n".join(f"[{n}] {h['title']}\n{h['text']}" for n, h in enumerate(hits, 1))
                info = {"hits": [h["id"] for h in hits]}
        elif ch == "answer":
            if not text:
                obs, info = "Error: `answer` needs your final answer in `content`.", {"error": "empty_answer"}
            else:
                self.done = True
                ok = answer_matches(text, self.task)
                reward = 1.0 if ok else 0.0
                obs = "Correct." if ok else "Incorrect."
                info = {"correct": ok, "ended_by": "answer"}
        elif ch == "action":
            if not text:
                obs, info = "Error: `action` needs a message for the user in `content`.", {"error": "empty_message"}
            else:
                obs = f"User: {self.ask_user(text)}"
        else:
            obs, info = f"Error: unknown choice {choice!r}; use one of {list(CHOICES)}.", {"error": "unknown_choice"}
        if not self.done and self.steps >= self.max_steps:
            self.done = True
            obs += "\nThe maximum number of steps is reached; the episode ends without an answer."
            info["ended_by"] = "max_steps"
        return StepResult(obs, reward, self.done, info)

    def user_system_prompt(self) -> str:
        return USER_PROMPT.format(question=self.task["question"])

    def hidden_facts(self) -> list[str]:
        return list(dict.fromkeys([self.task["answer"], *self.task.get("aliases", [])]))
