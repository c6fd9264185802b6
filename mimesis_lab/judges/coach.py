"""The CSD coach ``h_t = G(H_t, y_t, z_t, x_{t+1})`` (SPEC §3.3.3).

For a coached agent turn ``t`` the coach sees the public history ``H_t`` before the agent's
reply, the simulator's private reasoning ``z_t`` before this turn (``privileged[t-1]``; empty on
the first turn) and the user's next public utterance ``x_{t+1}`` (``privileged[t]``), and writes
a short note on what the reply should address. The **prospective** style (default) never sees
the reply ``y_t``; the **corrective** style does. A note must not reveal private facts (dates,
budgets, preferences, the answer): the prompt forbids it, and
:mod:`mimesis_lab.judges.leak` checks it. An endpoint failure or a ``NONE`` answer skips the
turn; valid notes are stripped and cut to :data:`MAX_NOTE_CHARS` characters.

Coaches: :class:`TemplateCoach` (offline default, deterministic, no model) and
:class:`OpenAICoach` (``{base_url}/chat/completions`` through the shared retry loop
:meth:`mimesis_lab.endpoint.ChatEndpoint.call`, bounded retries, never raises for endpoint problems). :func:`check_coach_endpoint` refuses a coach endpoint on the same server as the
simulator's upstream or its privileged shim (coach calls must not pollute the user-reasoning
buffer).

Both coaches count their outcomes (thread-safe: the CSD post-pass calls the coach from a thread
pool): :meth:`OpenAICoach.failure_counts` gives ``calls``, ``ok`` (a note or ``NONE``), ``failures``,
``failures/<reason>`` (the endpoint's reason: ``http``, ``transport``, ``timeout``, ``malformed``,
``invalid``, ``refusal``), ``failures_transient`` and ``recovered_retries``; ``reset=True`` starts the
next step's tally.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from mimesis_lab.config import OpenAIEndpoint
from mimesis_lab.endpoint import AnswerError, ChatEndpoint, Tally, chat_message

__all__ = ["MAX_NOTE_CHARS", "STYLES", "CoachInput", "CoachResult", "parse_note", "coach_messages", "TemplateCoach",
           "OpenAICoach", "make_coach", "check_coach_endpoint", "action_note", "RECOMMENDS"]

MAX_NOTE_CHARS = 600
STYLES = ("prospective", "corrective")
RETRY_BACKOFF_S = 1.0
_NONE = re.compile(r"[\W_]*none[\W_]*", re.IGNORECASE)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


@dataclass
class CoachInput:
    """What the coach sees for one agent turn (``reply`` only reaches the corrective style)."""

    history: list[dict]
    reasoning: str = ""
    next_utterance: str = ""
    reply: str = ""
    gym: str = ""


@dataclass
class CoachResult:
    """``status``: ``ok`` (``note`` set), ``none`` (nothing to say) or ``failure`` (``detail`` says why,
    ``reason`` is the endpoint's failure kind; ``transient``: the endpoint's retries ran out on a timeout,
    transport error, 429 or 5xx). ``kind``: the :class:`TemplateCoach` cue that leads the note (a key of
    :data:`NOTES`), empty for other coaches."""

    note: str | None
    status: str
    detail: str = ""
    transient: bool = False
    recovered_retries: int = 0     # failed endpoint attempts before this answer (OpenAICoach)
    reason: str = ""
    kind: str = ""


def _style(style: str) -> str:
    if style not in STYLES:
        raise ValueError(f"coach style must be one of {list(STYLES)}, got {style!r}")
    return style


def parse_note(text: Any) -> CoachResult:
    """A coach answer → result: ``<think>`` blocks dropped; empty or ``NONE`` (any case,
    optional punctuation) → ``none``; else ``ok`` with the stripped note cut to 600 characters."""
    if not isinstance(text, str):
        return CoachResult(None, "failure", f"answer is not a string: {type(text).__name__}")
    note = _THINK.sub("", text).strip()
    if not note or _NONE.fullmatch(note):
        return CoachResult(None, "none")
    return CoachResult(note[:MAX_NOTE_CHARS].strip(), "ok")


def _render_history(history: list[dict], max_chars: int) -> str:
    """The most recent messages as ``ROLE: content`` lines within ``max_chars`` (older ones are
    dropped and counted; a single over-long latest message keeps its tail)."""
    lines = [f"{str(m.get('role', '')).upper()}: {m.get('content', '')}" for m in history]
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        if used + len(line) + 1 > max_chars:
            if not kept:
                kept.append("…" + (line[len(line) - max_chars + 1:] if max_chars > 1 else ""))
            break
        kept.append(line)
        used += len(line) + 1
    kept.reverse()
    omitted = len(lines) - len(kept)
    head = [f"({omitted} earlier message(s) omitted)"] if omitted else []
    return "\n".join(head + kept) if lines else "(no messages yet)"


def coach_messages(inp: CoachInput, style: str = "prospective", max_history_chars: int = 4000) -> list[dict]:
    """The coach prompt. ``prospective`` never includes ``inp.reply``; ``corrective`` does."""
    corrective = _style(style) == "corrective"
    seen = "the agent's reply at this turn, " if corrective else ""
    system = (
        f"You coach an AI agent that talks to a user in a task environment ({inp.gym or 'unknown'}). You see the "
        f"public conversation so far, {seen}the user's private reasoning before this turn and the user's next "
        "message. Write a short note (one to three sentences) on what the agent's reply at this turn should "
        "address: for example answer the user's question, ask about a topic not covered yet, change approach, "
        "or give the final answer now.\n"
        "Never reveal private facts: no dates, budgets, prices or other numbers, no preferences or their values, "
        "no names, option ids or the answer. Name only generic topics (e.g. 'budget', 'location', 'dates').\n"
        "If there is nothing useful to say, answer exactly NONE.")
    reasoning = inp.reasoning.strip() or "(absent: no private reasoning is available for this turn)"
    nxt = inp.next_utterance.strip() or "(absent: the user has no next message)"
    parts = [f"Conversation so far:\n{_render_history(inp.history, max_history_chars)}",
             f"User's private reasoning before this turn:\n{reasoning}",
             f"User's next message:\n{nxt}"]
    if corrective:
        parts.append(f"Agent's reply at this turn:\n{inp.reply.strip() or '(empty)'}")
    parts.append("Write the note for the agent's reply at this turn, or NONE.")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


# ---- template coach -------------------------------------------------------------------------------

def _rx(*alts: str) -> re.Pattern:
    return re.compile(r"(?<![a-z])(?:" + "|".join(alts) + r")(?![a-z])", re.IGNORECASE)


_QUESTION_START = _rx("what", "which", "how", "why", "where", "when", "who", "can you", "could you", "do you",
                      "does it", "is there", "are there", "will you", "would you")
_NEGATIVE_SAID = _rx("no", "nope", "not", "actually", "wrong", "incorrect", "irrelevant", "disagree", "not what",
                     "that's not", "that is not", "isn't", "doesn't", "don't", "didn't", "instead", "rather not",
                     r"too (?:expensive|far|late|early|much|long|slow|pricey)", "i said", "as i said")
_NEGATIVE_THOUGHT = _rx(r"frustrat\w*", r"annoy\w*", "unhelpful", "not helpful", r"ignor\w*", "not listening",
                        r"repeat\w*", "again", "not what i", r"disappoint\w*", "unconvinced", "not convinced",
                        "doesn't understand", "does not understand")
_FAILED = _rx("didn't work", "did not work", r"fail\w*", "error", "invalid", "no results", "no options match",
              "not found", "try again", "wrong answer", "incorrect", "malformed")
_UNMET = _rx("prefer", r"preferences?", "i need", "i want", "i'd like", "i would like", "must", r"requir\w*",
             "important to me", "care about", "hasn't asked", "has not asked", "haven't been asked", "didn't ask",
             "did not ask", "not asked", "hasn't mentioned", "haven't mentioned", "haven't told", "not told",
             "doesn't know", "does not know", "not yet", "still need")
_READY = _rx("sounds good", "sounds great", "that works", "go ahead", "let's go with", "i'll take", "book it",
             "i'm ready", "ready to", "that's all", "that is all", "nothing else", "i agree", "you've convinced",
             "you convinced", "makes sense", "perfect", "that's everything", "good enough", "enough information",
             "ready for a recommendation", "go with that")
#: generic category -> cue words; only the category name ever appears in a note.
CATEGORIES: tuple[tuple[str, re.Pattern], ...] = (
    ("budget", _rx("budget", "price", "cost", "cheap", "expensive", "afford", "money", "spend", "pricey",
                   r"\$\d*")),
    ("location", _rx("location", "near", "close to", "area", "beach", "downtown", "centre", "center",
                     "district", r"neighbou?rhood", "walk", "distance", "view")),
    ("amenities", _rx(r"amenit\w*", "pool", "wifi", "wi-fi", "breakfast", "parking", "pet", "dog", "gym", "spa",
                      "kitchen", "bag", "luggage", "garden", "features?")),
    ("dates", _rx(r"dates?", "days?", "week", "weekend", "month", "morning", "evening", "nights?", "noon",
                  "schedule", "depart", "arrive", "timing")),
    ("rating", _rx(r"ratings?", r"reviews?", r"stars?", "quality")),
    ("companions", _rx("kids", "children", "partner", "family", "alone", "friends", "group")),
    ("transport", _rx("car", "train", "plane", r"flights?", "nonstop", "layover", "bus", "drive")),
)
NOTES = {
    "failed": "The previous attempt did not work: try a different action rather than repeating it.",
    "negative": "The user is not satisfied: change approach and do not repeat the previous suggestion.",
    "question": "Answer the user's question first, directly.",
    "unmet": "Ask about their remaining preferences{cats} before searching or answering.",
    "ready": "The user is ready: give the final answer now.",
    "no_tool": "Call the interact_with_env tool with a choice of action, search or answer.",
}
#: The agent tool choice a note recommends, for the cues that recommend one (:func:`action_note`; the CSD job splits
#: its note statistics by whether the reply took it).
RECOMMENDS = {"unmet": "action", "ready": "answer"}
_TOOL = re.compile(r"<tool_call>|\[(?:action|answer|search)\]", re.IGNORECASE)


def _is_question(utterance: str) -> bool:
    u = utterance.strip()
    return "?" in u or bool(u and _QUESTION_START.match(u))


def _is_negative(utterance: str, reasoning: str) -> bool:
    u = utterance.strip()
    starts = _NEGATIVE_SAID.match(u) is not None
    return starts or bool(_rx("wrong", "incorrect", "not what", "that's not", "that is not", "disagree",
                              "irrelevant").search(u)) or bool(_NEGATIVE_THOUGHT.search(reasoning))


class TemplateCoach:
    """Offline, deterministic coach (no model): cue rules over the reasoning and the next utterance.

    Cues, in this order (each adds one fixed sentence of :data:`NOTES`):

    1. ``failed`` — the reasoning/utterance says the previous attempt failed (error, invalid, no
       results, try again…) → try a different action;
    2. ``negative`` — the utterance starts with a negation/correction (``No``, ``Not``,
       ``Actually``…) or says wrong/irrelevant/not what, or the reasoning shows frustration or
       repetition → change approach, do not repeat the previous suggestion;
    3. ``question`` — the utterance is a question (``?`` or a question opener) → answer it first;
    4. ``unmet`` — the reasoning/utterance states or implies requirements not yet covered
       (prefer, need, must, hasn't asked…) → ask about the remaining preferences, naming only
       the generic :data:`CATEGORIES` whose cue words occur (``budget``, ``location``…), never
       a value;
    5. ``ready`` — the user agrees or is ready (sounds good, go ahead, makes sense…) and no
       ``negative`` cue fired → give the final answer now (this suppresses ``unmet``).

    The corrective style also sees the reply: a reply with no tool call gets ``no_tool`` first.
    No cue (e.g. empty reasoning and empty utterance) → ``NONE`` (status ``none``).
    """

    kind = "template"

    def __init__(self, style: str = "prospective"):
        self.style = _style(style)
        self.tally = Tally()

    def failure_counts(self, reset: bool = False) -> dict[str, int]:
        """Outcome counts (module docstring); the template coach never fails."""
        return self.tally.counts(reset)

    @staticmethod
    def cues(inp: CoachInput) -> list[str]:
        """The names of the cues that fire (keys of :data:`NOTES`), in note order."""
        u, z = inp.next_utterance or "", inp.reasoning or ""
        both = f"{z}\n{u}"
        out = []
        if _FAILED.search(both):
            out.append("failed")
        negative = _is_negative(u, z)
        if negative:
            out.append("negative")
        if _is_question(u):
            out.append("question")
        ready = not negative and bool(_READY.search(both))
        if _UNMET.search(both) and not ready:
            out.append("unmet")
        if ready:
            out.append("ready")
        return out

    @staticmethod
    def categories(text: str) -> list[str]:
        return [name for name, rx in CATEGORIES if rx.search(text)]

    def coach(self, inp: CoachInput) -> CoachResult:
        names = self.cues(inp)
        if self.style == "corrective" and inp.reply.strip() and not _TOOL.search(inp.reply):
            names.insert(0, "no_tool")
        self.tally.record(ok=True)
        if not names:
            return CoachResult(None, "none", "no cue")
        cats = self.categories(f"{inp.reasoning}\n{inp.next_utterance}")
        sentences = [NOTES[n].format(cats=f" ({', '.join(cats)})" if cats else "") for n in names]
        return replace(parse_note(" ".join(sentences)), kind=names[0])

    def close(self) -> None:
        pass


# ---- OpenAI-compatible coach ----------------------------------------------------------------------

def action_note(choice: str, content: str, reply: str = "") -> str | None:
    """The :class:`TemplateCoach` note that recommends the agent action ``[choice] content``, or ``None``.

    Used to teach a warm-start agent the coach's vocabulary (``agent_traces.coached_share``): CSD's
    teacher is the agent itself reading the note (SPEC §3.3 items 4–5), so an agent that never saw a
    note is a teacher that ignores it. A question to the user (``action`` whose content is a question)
    gets the ``unmet`` note, naming the generic :data:`CATEGORIES` whose cue words occur in the question
    or in ``reply`` (the user's answer, as the coach reads ``x_{t+1}``), never a value; a final
    ``answer`` gets the ``ready`` note. Any other action (a search, an argument) gets none: no note of
    the template coach recommends it."""
    if choice == RECOMMENDS["ready"]:
        return NOTES["ready"]
    if choice == RECOMMENDS["unmet"] and _is_question(content):
        cats = TemplateCoach.categories(f"{content}\n{reply}")
        return NOTES["unmet"].format(cats=f" ({', '.join(cats)})" if cats else "")
    return None


class OpenAICoach:
    """LLM coach over ``{base_url}/chat/completions``; bounded retries; never raises for endpoint problems."""

    kind = "openai"

    def __init__(self, endpoint: OpenAIEndpoint, style: str = "prospective", client: httpx.Client | None = None,
                 backoff_s: float | None = None, max_history_chars: int = 4000):
        self.endpoint, self.style = endpoint, _style(style)
        self.backoff_s = RETRY_BACKOFF_S if backoff_s is None else backoff_s
        self.max_history_chars = max_history_chars
        self.chat = ChatEndpoint(endpoint, client, backoff_s=self.backoff_s)
        self.tally = Tally()

    def failure_counts(self, reset: bool = False) -> dict[str, int]:
        """Outcome counts by reason (module docstring); ``reset`` starts a new tally."""
        return self.tally.counts(reset)

    def close(self) -> None:
        self.chat.close()

    def request_body(self, inp: CoachInput) -> dict[str, Any]:
        return {"model": self.endpoint.model, "temperature": self.endpoint.temperature,
                "messages": coach_messages(inp, self.style, self.max_history_chars)}

    def coach(self, inp: CoachInput) -> CoachResult:
        res = self.chat.call(self.request_body(inp), _note_answer)
        if res.ok:
            self.tally.record(ok=True, recovered_retries=res.recovered_retries)
            res.value.recovered_retries = res.recovered_retries
            return res.value
        f = res.failure
        self.tally.record(ok=False, reason=f.reason, transient=f.transient)
        return CoachResult(None, "failure", f.detail, transient=f.transient, reason=f.reason)


def _note_answer(payload: dict[str, Any]) -> CoachResult:
    """The shared loop's ``parse`` for a coach answer: ``ok`` or ``none``; a content that is not a string
    is an invalid answer (retried)."""
    res = parse_note(chat_message(payload).get("content"))
    if res.status == "failure":
        raise AnswerError(res.detail)
    return res


def make_coach(kind: str, endpoint: OpenAIEndpoint | None, style: str = "prospective"):
    """``template`` → :class:`TemplateCoach`; ``openai`` → :class:`OpenAICoach` (needs ``endpoint``)."""
    if kind == "template":
        return TemplateCoach(style)
    if kind == "openai":
        if endpoint is None:
            raise ValueError("the openai coach needs an endpoint")
        return OpenAICoach(endpoint, style)
    raise ValueError(f"coach kind must be 'template' or 'openai', got {kind!r}")


_LOCAL = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", "ip6-localhost"}


def _server(url: str) -> tuple[str, int]:
    """``(host, port)`` of a base URL: local names folded to ``localhost``, default ports 80/443."""
    text = str(url).strip()
    parts = urlsplit(text if "://" in text else f"http://{text}")
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        raise ValueError(f"not a URL with a host: {url!r}")
    if host in _LOCAL or host.startswith("127."):
        host = "localhost"
    try:
        port = parts.port
    except ValueError as e:
        raise ValueError(f"bad port in {url!r}: {e}") from None
    return host, port if port is not None else (443 if parts.scheme == "https" else 80)


def check_coach_endpoint(coach_base_url: str, forbidden_base_urls: list[str]) -> None:
    """Raise ``ValueError`` when the coach endpoint is the same server (host and port, scheme and
    path ignored, local names equal) as one of ``forbidden_base_urls`` — the simulator's upstream
    or its privileged shim: coach calls there would pollute the user-reasoning buffer."""
    coach = _server(coach_base_url)
    for url in forbidden_base_urls:
        if url and _server(url) == coach:
            raise ValueError(
                f"coach endpoint {coach_base_url!r} is the same server ({coach[0]}:{coach[1]}) as {url!r} (the "
                "simulator upstream or its privileged shim): coach calls would pollute the user-reasoning buffer; "
                "serve the coach from a separate endpoint")
