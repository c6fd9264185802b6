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

**A local corpus** (``gyms.search_corpus``: JSONL ``{id, title, text}``, e.g. passages of the pages
Bamboogle's questions need) replaces the bundled passages for every task; it is indexed with the
``rank-bm25`` library (``BM25Okapi``, same tokenizer), top-3 as above. Tasks may be UserRL's / Bamboogle's
records ``{id, question, answer}`` (an ``answer`` list: the first is the answer, the rest aliases).
A task whose answer (or an alias), normalised as above, occurs in no passage of its corpus is
**unanswerable** there (``task["answerable"] = False``): :func:`build_rows` refuses it
(:class:`UnanswerableTask`, so the ``gyms`` stage quarantines and counts it by that reason), and an
episode on it ends on ``answer`` with reward 0 and ``info["outcome"] = "unanswerable"`` — reported as
such, never as solved. :func:`corpus_report` counts answerable and unanswerable tasks.
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

from mimesis_lab.envs.gyms.base import (CHOICES, Gym, StepResult, check_finite, check_id, check_string_list,
                                        check_strings, register_gym, task_records)
from mimesis_lab.io import InputFileError

__all__ = ["SearchGym", "BM25", "LibraryBM25", "DEFAULT_TASKS", "DEFAULT_PASSAGES", "load_tasks", "load_passages",
           "build_rows", "normalize_answer", "answer_matches", "TOP_K", "UnanswerableTask", "answer_in_corpus",
           "corpus_report"]

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


class LibraryBM25:
    """BM25 of the ``rank-bm25`` library (``BM25Okapi``, k1 = 1.5, b = 0.75) with :func:`tokenize`; the
    same ``top`` as :class:`BM25`."""

    def __init__(self, docs: list[str], k1: float = 1.5, b: float = 0.75):
        from rank_bm25 import BM25Okapi
        self.n = len(docs)
        self.bm25 = BM25Okapi([tokenize(d) or [""] for d in docs], k1=k1, b=b)

    def top(self, query: str, k: int = TOP_K) -> list[tuple[int, float]]:
        q = tokenize(query)
        if not q or not self.n:
            return []
        sc = [float(x) for x in self.bm25.get_scores(q)]
        order = sorted(range(self.n), key=lambda i: (-sc[i], i))
        return [(i, sc[i]) for i in order[:k] if sc[i] > 0]


class UnanswerableTask(ValueError):
    """A search task whose answer occurs in no passage of its corpus."""


def load_passages(path: str | Path = DEFAULT_PASSAGES) -> list[dict]:
    out = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputFileError(f"{path}: cannot read the search corpus: {type(e).__name__}: {e}") from None
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                p = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputFileError(f"{path}, line {n}: not JSON: {e}") from None
            if not isinstance(p, dict) or not all(isinstance(p.get(k), str) for k in ("title", "text")) or "id" not in p:
                raise InputFileError(f"{path}, line {n}: a passage is {{id, title, text}} (strings): {line[:80]!r}")
            out.append(p)
    return out


@lru_cache(maxsize=4)
def _index(path: str, library: bool = False) -> tuple[tuple[dict, ...], BM25 | LibraryBM25]:
    passages = load_passages(path)
    docs = [f"{p['title']} {p['text']}" for p in passages]
    return tuple(passages), (LibraryBM25(docs) if library else BM25(docs))


@lru_cache(maxsize=4)
def _normalised_corpus(path: str) -> tuple[str, ...]:
    return tuple(f" {normalize_answer(p['title'] + ' ' + p['text'])} " for p in load_passages(path))


def answer_in_corpus(task: dict, path: str | Path) -> bool:
    """Whether the task's answer or an alias (normalised, as whole words) occurs in a passage at ``path``."""
    texts = _normalised_corpus(str(Path(path).resolve()))
    wanted = [f" {a} " for a in (normalize_answer(x) for x in [task["answer"], *task.get("aliases", [])]) if a.strip()]
    return any(w in t for t in texts for w in wanted)


def load_tasks(path: str | Path = DEFAULT_TASKS, corpus: str | Path | None = None) -> dict[str, dict]:
    """Tasks by id (ours, or Bamboogle's ``{id, question, answer}``); each gets ``passages_path``:
    ``corpus`` when given (``gyms.search_corpus``, searched with rank-bm25, and ``answerable`` set per
    task), else the passages the record names, else the sibling ``passages.jsonl``. A task without a
    non-empty string ``question`` / ``answer``, with ``aliases`` that are not a list of strings, or with a NaN
    anywhere is an error naming the file, the task and the field."""
    path = Path(path)
    if corpus is not None:
        load_passages(corpus)   # a broken corpus fails here, naming its file
    out: dict[str, dict] = {}
    for t in task_records(json.loads(path.read_text()), path, "search"):
        if not isinstance(t, dict):
            raise ValueError(f"{path}: a search task is a JSON object, not {t!r:.60}")
        for k in ("id", "question", "answer"):
            if k not in t:
                raise ValueError(f"{path}: search task without {k!r}: {t}")
        try:
            check_id(t)
            check_finite(t)
            check_strings(t, ("question",))
            check_string_list(t, "aliases")
        except ValueError as e:
            raise ValueError(f"{path}: search task {t.get('id')!r}: {e}") from None
        answers = t["answer"] if isinstance(t["answer"], list) else [t["answer"]]
        if not answers or not all(isinstance(a, str) and a.strip() for a in answers):
            raise ValueError(f"{path}: search task {t['id']!r}: field 'answer' must be a non-empty string (or list of "
                             f"them), got {t['answer']!r:.40}")
        if not all(normalize_answer(a) for a in [*answers, *t.get("aliases", [])]):
            raise ValueError(f"{path}: search task {t['id']!r}: field 'answer' (or 'aliases') has an answer that is "
                             "empty once normalised (no answer could match it)")
        t = dict(t, answer=answers[0], aliases=[*answers[1:], *list(t.get("aliases") or [])])
        if corpus is not None:
            t["passages_path"], t["retriever"] = str(corpus), "rank_bm25"
            t["answerable"] = answer_in_corpus(t, corpus)
        t.setdefault("passages_path", str(path.parent / "passages.jsonl"))
        out[str(t["id"])] = t
    return out


def corpus_report(tasks: dict[str, dict]) -> dict:
    """How many tasks their corpus can answer: ``{tasks, answerable, unanswerable, unanswerable_ids}``
    (a task without ``answerable`` — the bundled passages — counts as answerable)."""
    bad = sorted(tid for tid, t in tasks.items() if t.get("answerable") is False)
    return {"tasks": len(tasks), "answerable": len(tasks) - len(bad), "unanswerable": len(bad),
            "unanswerable_ids": bad}


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
    """One row per task; an unanswerable task (its corpus lacks the answer) raises :class:`UnanswerableTask`."""
    rows = []
    for i, (tid, t) in enumerate(tasks.items()):
        if t.get("answerable") is False:
            raise UnanswerableTask(f"unanswerable: search task {tid!r}: no passage of the corpus {t['passages_path']} "
                                   f"contains its answer {t['answer']!r} (or an alias)")
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
        self.passages, self.index = _index(str(Path(self.task.get("passages_path") or DEFAULT_PASSAGES).resolve()),
                                           self.task.get("retriever") == "rank_bm25")

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
                if self.task.get("answerable") is False:   # reported as unanswerable, never as solved
                    obs = "The search corpus does not contain the answer to this question; it is not scored."
                    info = {"correct": ok, "ended_by": "answer", "outcome": "unanswerable"}
                else:
                    reward = 1.0 if ok else 0.0
                    obs = "Correct." if ok else "Incorrect."
                    info = {"correct": ok, "ended_by": "answer", "outcome": "correct" if ok else "incorrect"}
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
