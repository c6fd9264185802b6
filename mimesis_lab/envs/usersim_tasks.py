"""Three ThoughtTrace user-simulation tasks (SPEC §2.3) with rule-based rewards, and their row builders.

- ``usersim_next_turn``: next-user-turn realism against a held-out human turn (single turn).
- ``usersim_persona``: profile/persona consistency while talking to the *replayed* recorded assistant.
- ``usersim_tom``: theory of mind, say why the user wrote their last message (single turn), scored
  against the user's self-reported reasons.

No judge is used: ``score(judge)`` ignores ``judge`` and never raises (an exception becomes
``TaskScore.failed("env_error", …)``). The simulator speaks in the ``assistant`` slot; its earlier
turns are shown as public utterances. Public log: simulator turns as ``role="user"``, replayed AI
replies as ``role="assistant"``; private log: simulator turns with ``reasoning``. Rows are built
from ThoughtTrace split rows (``data/splits/thoughttrace/*.parquet``: ``conversation_id``,
``user_id``, ``system_prompt``, ``turns`` with original roles and ``reasons``, or if ``turns`` is
missing the role-swapped ``messages``); malformed conversations are skipped with a reason.
"""
from __future__ import annotations

from abc import abstractmethod

import re
from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

from mimesis_lab.envs.base import SimEpisode, TaskScore, register_task
from mimesis_lab.envs.output_format import ParsedReply
from mimesis_lab.thoughttrace import REACTION_PREFIX, is_alternating

__all__ = [
    "NEXT_TURN", "PERSONA", "TOM", "TOM_QUESTION", "NextTurnEpisode", "PersonaEpisode", "TomEpisode",
    "words", "content_words", "token_f1", "length_ratio", "is_assistant_like", "has_politeness", "realism_score",
    "persona_turn_score", "profile_contradictions", "parse_system_prompt", "tom_score", "load_thoughttrace_rows",
    "build_next_turn_rows", "build_persona_rows", "build_tom_rows", "build_rows_with_skips",
]

NEXT_TURN, PERSONA, TOM = "usersim_next_turn", "usersim_persona", "usersim_tom"
TOM_QUESTION = "Why did the user write their last message? Answer as the user, in one or two sentences."

# ----------------------------------------------------------------------------- text helpers
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")

STOP_WORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her
here hers herself him himself his how i i'd i'll i'm i've if in into is it it's its itself just me more most
my myself no nor not now of off on once only or other our ours ourselves out over own same she should so
some such than that that's the their theirs them themselves then there these they this those through to
too under until up very was we were what when where which while who whom why will with would you you're
your yours yourself yourselves im dont don't didn't wasn't isn't can't also get got let make made want wanted
please thanks thank ok okay yes yeah hi hello
""".split())

_POLITE = re.compile(r"\b(please|pls|plz|thanks|thank you|thank u|thx|ty|sorry|appreciate[d]?|kindly|cheers)\b")
_ASSISTANT_LIKE = re.compile("|".join((
    r"\bas an ai\b", r"\bas a (?:large )?language model\b", r"\bi'?m (?:just )?an ai\b", r"\bi am (?:just )?an ai\b",
    r"^\s*certainly\s*[!,.]", r"^\s*absolutely\s*!", r"\bi'?d be (?:happy|glad|delighted) to\b",
    r"\bi would be (?:happy|glad|delighted) to\b", r"\bhow (?:can|may) i (?:help|assist) you\b",
    r"\bi hope this helps\b", r"\bgreat question\b", r"\blet me know if you (?:have|need) any\b",
    r"^\s*here(?: is|'s) (?:a|an|your) (?:revised|updated|corrected|improved|rewritten|polished|summary|draft"
    r"|version|list|breakdown|overview|step-by-step|example)\b",
)))


def _norm(text: Any) -> str:
    return str(text or "").lower().replace("\u2019", "'").replace("\u2018", "'")


def words(text: Any) -> list[str]:
    """Lower-cased word tokens (letters/digits, inner apostrophes kept: ``I'd`` → ``i'd``)."""
    return _WORD.findall(_norm(text))


def _stem(w: str) -> str:
    return w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w


def content_words(text: Any) -> list[str]:
    """Word tokens without stop words (order and repeats kept)."""
    return [w for w in words(text) if w not in STOP_WORDS]


def token_f1(pred: Sequence[str], ref: Sequence[str]) -> tuple[float, float, float]:
    """Multiset (bag-of-words) ``(f1, precision, recall)``; both empty → 1, one empty → 0."""
    if not pred and not ref:
        return 1.0, 1.0, 1.0
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0, 0.0, 0.0
    p, r = common / len(pred), common / len(ref)
    return 2 * common / (len(pred) + len(ref)), p, r


def length_ratio(n_pred: int, n_ref: int) -> float:
    """``min/max`` of two word counts (both 0 → 1)."""
    if n_pred == 0 and n_ref == 0:
        return 1.0
    return min(n_pred, n_ref) / max(n_pred, n_ref)


def is_assistant_like(text: Any) -> bool:
    """Assistant phrasing a human user would not write ("As an AI", "Certainly!", "I'd be happy to",
    "Here is a revised version", "I hope this helps", …)."""
    return bool(_ASSISTANT_LIKE.search(_norm(text)))


def has_politeness(text: Any) -> bool:
    return bool(_POLITE.search(_norm(text)))


# ----------------------------------------------------------------------------- next-turn realism
def realism_score(pred: str, ref: str) -> tuple[float, dict[str, float]]:
    """Realism of a simulated user turn ``pred`` against the held-out human turn ``ref``::

        f1         = bag-of-words F1 of lower-cased word tokens (2·common / (|pred| + |ref|))
        len        = min(n_pred, n_ref) / max(n_pred, n_ref)            (word counts)
        style      = ( [is_question(pred) == is_question(ref)]          ('?' present)
                     + [polite(pred) == polite(ref)]                    (please/thanks/sorry/…)
                     + (1 - assistant_like(pred)) ) / 3
        r          = 0.5·f1 + 0.25·len + 0.25·style,   then r = r / 2 if assistant_like(pred)

    Returns ``(r, components)`` with components ``f1``, ``length_ratio``, ``style``,
    ``assistant_like`` (0/1).
    """
    pw, rw = words(pred), words(ref)
    f1 = token_f1(pw, rw)[0]
    lr = length_ratio(len(pw), len(rw))
    al = 1.0 if is_assistant_like(pred) else 0.0
    q_match = 1.0 if ("?" in pred) == ("?" in ref) else 0.0
    p_match = 1.0 if has_politeness(pred) == has_politeness(ref) else 0.0
    style = (q_match + p_match + (1.0 - al)) / 3.0
    r = 0.5 * f1 + 0.25 * lr + 0.25 * style
    if al:
        r /= 2.0
    return min(1.0, max(0.0, r)), {"f1": f1, "length_ratio": lr, "style": style, "assistant_like": al}


# ----------------------------------------------------------------------------- persona consistency
OCCUPATIONS = frozenset("""
nurse engineer developer programmer coder teacher educator tutor professor lecturer instructor student doctor
physician surgeon dentist pharmacist paramedic veterinarian therapist psychologist lawyer attorney paralegal
chef cook baker waiter waitress bartender cashier clerk designer translator interpreter analyst manager
accountant economist banker electrician plumber carpenter mechanic technician architect scientist researcher
writer journalist editor artist musician photographer consultant coordinator specialist salesperson marketer
entrepreneur farmer pilot firefighter soldier librarian secretary receptionist freelancer intern retiree
homemaker realtor driver
""".split())
_SYNONYMS = ({"engineer", "developer", "programmer", "coder"},
             {"teacher", "educator", "tutor", "professor", "lecturer", "instructor"},
             {"doctor", "physician", "surgeon"}, {"lawyer", "attorney"}, {"chef", "cook"},
             {"salesperson", "representative"}, {"waiter", "waitress"}, {"retiree", "retired"})
_OCC_CLAIM = re.compile(r"(?<!such )\b(?:i am|i'm|im|i was|i work as|as) (?:a|an) ((?:[a-z'-]+ ){0,3}[a-z'-]+)")
_AGE_CLAIMS = (
    re.compile(r"\bi(?:'m| am|m) (\d{1,3})(?:\s*(?:years?|yrs?)[\s-]*old\b|\s*y/?o\b|(?=\s*(?:[.,;!?)]|and\b|$)))"),
    re.compile(r"\b(?:a|an) (\d{1,3})[\s-]*(?:years?|yrs?)[\s-]*old\b"),
    re.compile(r"\bmy age is (\d{1,3})\b"),
)


def parse_system_prompt(system_prompt: str) -> dict[str, Any]:
    """``task``, ``expectations``, ``profile_text`` and ``profile`` (``{"age": "25-34", …}``) of a
    ThoughtTrace system prompt (its ``Task:``, ``Expectations:``, ``User profile:`` lines)."""
    out: dict[str, Any] = {"task": "", "expectations": "", "profile_text": "", "profile": {}}
    for line in str(system_prompt or "").splitlines():
        for label, key in (("Task:", "task"), ("Expectations:", "expectations"), ("User profile:", "profile_text")):
            if line.startswith(label):
                out[key] = line[len(label):].strip()
    for part in out["profile_text"].split(";"):
        k, sep, v = part.partition(":")
        if sep and k.strip() and v.strip():
            out["profile"][k.strip().lower()] = v.strip()
    return out


def _age_range(age: str) -> tuple[int, int] | None:
    a = _norm(age)
    if m := re.search(r"(\d+)\s*[-\u2013to ]+\s*(\d+)", a):
        return int(m.group(1)), int(m.group(2))
    if m := re.search(r"(\d+)\s*\+|(?:over|above) (\d+)", a):
        return int(m.group(1) or m.group(2)), 200
    if m := re.search(r"(?:under|below) (\d+)", a):
        return 0, int(m.group(1)) - 1
    return None


def profile_contradictions(text: str, profile: Mapping[str, Any]) -> list[str]:
    """Claims in ``text`` that contradict the profile: ``"I am a/an X"``, ``"as a X"``, ``"I work as a
    X"`` with an occupation noun X (from :data:`OCCUPATIONS`, within the next 4 words) that is not
    the profile's occupation (nor a close synonym), and an age claim (``"I'm 30"``, ``"I am 30 years
    old"``, ``"a 30-year-old"``, ``"my age is 30"``) outside the profile's age range."""
    t, out = _norm(text), []
    occ = str(profile.get("occupation") or "").strip()
    if occ:
        pw = {_stem(w) for w in words(occ)}
        for m in _OCC_CLAIM.finditer(t):
            head = next((_stem(w) for w in m.group(1).split() if _stem(w) in OCCUPATIONS), None)
            if head is not None and head not in pw and not any(head in g and g & pw for g in _SYNONYMS):
                out.append(f"occupation {head!r} vs profile {occ!r}")
    rng = _age_range(str(profile.get("age") or ""))
    if rng is not None:
        for pat in _AGE_CLAIMS:
            for m in pat.finditer(t):
                if not rng[0] <= int(m.group(1)) <= rng[1]:
                    out.append(f"age {m.group(1)} vs profile {profile.get('age')!r}")
    return out


def persona_turn_score(utterance: str, *, task: str, expectations: str, prev_reply: str,
                       profile: Mapping[str, Any], copy_ngram: int = 10,
                       max_words: int = 120) -> tuple[float, dict[str, float]]:
    """Consistency of one simulator turn = mean of four 0..1 checks::

        on_task    = min(1, |U ∩ R| / min(2, |U|))  (0 if U is empty), U = distinct content words of
                     the utterance, R = content words of task + expectations + the AI reply it answers
                     (words compared after stripping a plural 's')
        in_role    = 0 if assistant-like phrasing or a shared run of >= copy_ngram words with that AI
                     reply (copying it), else 1
        profile_ok = 0 if a profile contradiction is found (:func:`profile_contradictions`), else 1
        length_ok  = 1 if 1 <= word count <= max_words, else 0
    """
    uw = words(utterance)
    u = {_stem(w) for w in content_words(utterance)}
    ref = {_stem(w) for w in content_words(f"{task}\n{expectations}\n{prev_reply}")}
    on_task = 0.0 if not u else min(1.0, len(u & ref) / min(2, len(u)))
    pr = words(prev_reply)
    grams = {tuple(pr[i:i + copy_ngram]) for i in range(len(pr) - copy_ngram + 1)} if copy_ngram > 0 else set()
    copied = any(tuple(uw[i:i + copy_ngram]) in grams for i in range(len(uw) - copy_ngram + 1))
    in_role = 0.0 if (is_assistant_like(utterance) or copied) else 1.0
    profile_ok = 0.0 if profile_contradictions(utterance, profile) else 1.0
    length_ok = 1.0 if 1 <= len(uw) <= max_words else 0.0
    comps = {"on_task": on_task, "in_role": in_role, "profile_ok": profile_ok, "length_ok": length_ok}
    return sum(comps.values()) / 4.0, comps


# ----------------------------------------------------------------------------- theory of mind
def tom_score(answer: str, reasons: Sequence[str] | str) -> tuple[float, dict[str, float]]:
    """Bag-of-words F1 of the answer's content words (stop words removed) against the concatenated
    self-reported reasons; ``r = f1`` (already in [0, 1]); components ``f1``, ``precision``, ``recall``."""
    ref = reasons if isinstance(reasons, str) else " ".join(reasons)
    pred_w, ref_w = content_words(answer), content_words(ref)
    f1, p, r = token_f1(pred_w, ref_w) if pred_w else (0.0, 0.0, 0.0)
    return f1, {"f1": f1, "precision": p, "recall": r}


# ----------------------------------------------------------------------------- episodes
class _UserSimEpisode(SimEpisode):
    """Shared logging and the never-raising score wrapper."""

    def _record(self, parsed: ParsedReply, public: str) -> None:
        if self.done:
            raise RuntimeError(f"{self.data_source} episode {self.task_id} is already over")
        self.public_log.append({"role": "user", "content": public})
        self.private_log.append({"role": "user", "reasoning": parsed.reasoning, "content": public})

    def observe(self, parsed: ParsedReply, public: str) -> bool:
        """Single-turn default: record the turn, the episode is over."""
        self._record(parsed, public)
        self.done = True
        return True

    def score(self, judge: Any) -> TaskScore:  # noqa: ARG002 - no judge for these tasks
        try:
            if not self.private_log:
                return TaskScore.failed("empty_reply", "no simulator turn was observed")
            raw, comps = self._score()
            return TaskScore(raw=float(min(1.0, max(0.0, raw))), components=comps)
        except Exception as e:  # scores never raise
            return TaskScore.failed("env_error", f"{self.data_source} score: {type(e).__name__}: {e}")

    @abstractmethod
    def _score(self) -> tuple[float, dict[str, float]]:
        """``(raw score, components)`` of the finished episode (each task defines its own)."""


@register_task
class NextTurnEpisode(_UserSimEpisode):
    """Write the next user turn of a real conversation; scored against the held-out human turn.

    ``messages()`` = system prompt + the turns before human turn ``k`` (human turns as their public
    utterance in the ``assistant`` slot, AI replies in the ``user`` slot; the last one is an AI reply).
    """

    data_source = NEXT_TURN

    def messages(self) -> list[dict[str, str]]:
        ctx = [{"role": str(m["role"]), "content": str(m["content"])} for m in self.row["context"]]
        return [{"role": "system", "content": str(self.row["system_prompt"])}] + ctx

    def _score(self) -> tuple[float, dict[str, float]]:
        return realism_score(self.public_log[-1]["content"], str(self.row["reference"]))


@register_task
class PersonaEpisode(_UserSimEpisode):
    """Talk, as the profiled user, with the replayed recorded assistant for ``turn_budget`` turns.

    ``turn_budget = min(ctx.option("usersim_persona", "turn_budget", 3), #human turns)``. The recorded AI
    opening (``opening``: a support agent's greeting before the user's first message, if any) comes first;
    after the simulator's turn ``j`` (not the last) the ``j``-th recorded AI reply is shown. Reward = mean over
    simulator turns of :func:`persona_turn_score` (options ``copy_ngram`` 10, ``max_words`` 120).
    """

    data_source = PERSONA

    def __init__(self, row, ctx, rng):
        super().__init__(row, ctx, rng)
        self.ai_replies = [str(r) for r in (row.get("ai_replies") or [])]
        n_human = len(row.get("human_turns") or []) or len(self.ai_replies)
        opt = int(ctx.option(PERSONA, "turn_budget", 3))
        self.turn_budget = max(1, min(opt, n_human, len(self.ai_replies) + 1))
        self.opening = [str(r) for r in (row.get("opening") or [])]
        self._chat: list[dict[str, str]] = [{"role": "user", "content": o} for o in self.opening]
        self.public_log.extend({"role": "assistant", "content": o} for o in self.opening)

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": str(self.row["system_prompt"])}] + list(self._chat)

    def observe(self, parsed: ParsedReply, public: str) -> bool:
        self._record(parsed, public)
        self._chat.append({"role": "assistant", "content": public})
        j = len(self.private_log) - 1
        if len(self.private_log) >= self.turn_budget:
            self.done = True
            return True
        reply = self.ai_replies[j]
        self._chat.append({"role": "user", "content": reply})
        self.public_log.append({"role": "assistant", "content": reply})
        return False

    def _score(self) -> tuple[float, dict[str, float]]:
        profile = dict(self.row.get("profile") or {})
        task, exp = str(self.row.get("task") or ""), str(self.row.get("expectations") or "")
        copy_n = int(self.ctx.option(PERSONA, "copy_ngram", 10))
        max_w = int(self.ctx.option(PERSONA, "max_words", 120))
        scores, comps = [], Counter()
        for j, turn in enumerate(self.private_log):
            prev = self.ai_replies[j - 1] if j >= 1 else (self.opening[-1] if self.opening else "")
            s, c = persona_turn_score(turn["content"], task=task, expectations=exp, prev_reply=prev,
                                      profile=profile, copy_ngram=copy_n, max_words=max_w)
            scores.append(s)
            comps.update(c)
        n = len(scores)
        return sum(scores) / n, {k: comps[k] / n for k in ("on_task", "in_role", "profile_ok", "length_ok")}


@register_task
class TomEpisode(_UserSimEpisode):
    """Say why the user wrote their last message.

    Prompt layout: a ``system`` message with the persona lines (task, expectations, profile) and the
    conversation up to and including the user's message as a plain transcript (``User:`` /
    ``Assistant:`` blocks; AI replies longer than option ``max_reply_chars`` (2000) are cut), then
    one ``user``-slot message with :data:`TOM_QUESTION`. Reward = :func:`tom_score` against the
    self-reported reasons of that message.
    """

    data_source = TOM

    def messages(self) -> list[dict[str, str]]:
        cap = int(self.ctx.option(TOM, "max_reply_chars", 2000))
        lines = ["You are the human user in the conversation below, talking to an AI assistant. Think about "
                 "your reasons inside <think></think>, then answer in your own words."]
        for label, key in (("Task", "task"), ("Expectations", "expectations"), ("User profile", "profile_text")):
            if self.row.get(key):
                lines.append(f"{label}: {self.row[key]}")
        lines.append("\nConversation so far:")
        for m in self.row["context"]:
            text = str(m["content"])
            if m["role"] == "user":
                lines.append(f"User: {text}\n")
            else:
                lines.append(f"Assistant: {text if len(text) <= cap else text[:cap] + ' …'}\n")
        return [{"role": "system", "content": "\n".join(lines).rstrip()},
                {"role": "user", "content": TOM_QUESTION}]

    def _score(self) -> tuple[float, dict[str, float]]:
        return tom_score(self.public_log[-1]["content"], list(self.row["reasons"]))


# ----------------------------------------------------------------------------- row builders
def load_thoughttrace_rows(path: Any) -> list[dict[str, Any]]:
    """The ThoughtTrace split rows of one parquet file, as dicts (:class:`~mimesis_lab.io.ParquetReadError`)."""
    from mimesis_lab.io import read_parquet

    return read_parquet(path, "ThoughtTrace split rows").to_dicts()


_THINK = re.compile(r"^\s*<think>(.*?)</think>(.*)$", re.DOTALL)


def _turns(conv: Mapping[str, Any]) -> tuple[list[dict[str, Any]] | None, str | None]:
    """Original turns ``[{role: user|assistant, content, reasons}]`` of a conversation, or an error."""
    raw = conv.get("turns")
    if raw is None:
        msgs = conv.get("messages")
        if not msgs:
            return None, "missing turns and messages"
        raw = []
        for m in msgs:
            if not isinstance(m, Mapping):
                return None, "malformed message"
            if m.get("role") == "assistant":
                mt = _THINK.match(str(m.get("content") or ""))
                reasons = [ln for ln in mt.group(1).splitlines() if not ln.startswith(REACTION_PREFIX)] if mt else []
                content = mt.group(2) if mt else m.get("content")
                raw.append({"role": "user", "content": content, "reasons": reasons})
            elif m.get("role") == "user":
                raw.append({"role": "assistant", "content": m.get("content"), "reasons": []})
    turns = []
    for t in raw:
        if not isinstance(t, Mapping) or t.get("role") not in ("user", "assistant"):
            return None, "malformed turn"
        content = str(t.get("content") or "").strip()
        if not content:
            return None, f"empty {t.get('role')} turn"
        reasons = [str(r).strip() for r in (t.get("reasons") or []) if str(r or "").strip()]
        turns.append({"role": t["role"], "content": content, "reasons": reasons})
    ok, why = is_alternating([t["role"] for t in turns])
    return (turns, None) if ok else (None, why or "not alternating")


def _base(conv: Mapping[str, Any], kind: str, task_id: str) -> dict[str, Any]:
    return {"data_source": kind, "task_id": task_id, "conversation_id": str(conv["conversation_id"]),
            "user_id": str(conv.get("user_id") or "")}


def _limit(items: list[Any], n: int | None) -> list[Any]:
    return items if n is None else items[:max(0, int(n))]


def _next_turn(conv, turns, sp, max_per):
    humans = [i for i, t in enumerate(turns) if t["role"] == "user"]
    if len(humans) < 2:
        return [], "no human turn after the first"
    rows = []
    for k in _limit(list(range(1, len(humans))), max_per):
        ctx = [{"role": "assistant" if t["role"] == "user" else "user", "content": t["content"]}
               for t in turns[:humans[k]]]
        row = _base(conv, NEXT_TURN, f"{conv['conversation_id']}#t{k}")
        row.update(system_prompt=sp, turn_index=k, context=ctx, reference=turns[humans[k]]["content"],
                   reference_reasons=list(turns[humans[k]]["reasons"]))
        rows.append(row)
    return rows, None


def _persona(conv, turns, sp, max_per):
    if max_per is not None and max_per < 1:
        return [], None
    info = parse_system_prompt(sp)
    row = _base(conv, PERSONA, f"{conv['conversation_id']}#persona")
    first = next(i for i, t in enumerate(turns) if t["role"] == "user")       # after the AI's opening, if any
    row.update(system_prompt=sp, task=info["task"], expectations=info["expectations"], profile=info["profile"],
               opening=[t["content"] for t in turns[:first]],
               human_turns=[t["content"] for t in turns if t["role"] == "user"],
               ai_replies=[t["content"] for t in turns[first:] if t["role"] == "assistant"])
    return [row], None


def _tom(conv, turns, sp, max_per):
    info = parse_system_prompt(sp)
    humans = [i for i, t in enumerate(turns) if t["role"] == "user"]
    elig = [(k, i) for k, i in enumerate(humans) if content_words(" ".join(turns[i]["reasons"]))]
    if not elig:
        return [], "no human turn with self-reported reasons"
    rows = []
    for k, i in _limit(elig, max_per):
        row = _base(conv, TOM, f"{conv['conversation_id']}#tom{k}")
        row.update(task=info["task"], expectations=info["expectations"], profile_text=info["profile_text"],
                   turn_index=k, context=[{"role": t["role"], "content": t["content"]} for t in turns[:i + 1]],
                   reasons=list(turns[i]["reasons"]))
        rows.append(row)
    return rows, None


_BUILDERS = {NEXT_TURN: _next_turn, PERSONA: _persona, TOM: _tom}
_KINDS = {"next_turn": NEXT_TURN, "persona": PERSONA, "tom": TOM, **{k: k for k in _BUILDERS}}


def build_rows_with_skips(kind: str, conversations: Iterable[Mapping[str, Any]],
                          max_per_conversation: int | None = None
                          ) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Rows of task ``kind`` (``next_turn``/``persona``/``tom`` or the data_source) and the skipped
    conversations as ``(conversation_id, reason)``. ``max_per_conversation`` keeps the first rows of
    each conversation (persona has one row per conversation)."""
    if kind not in _KINDS:
        raise ValueError(f"unknown usersim task kind {kind!r} (known: {sorted(_KINDS)})")
    build = _BUILDERS[_KINDS[kind]]
    rows: list[dict[str, Any]] = []
    skipped: list[tuple[str, str]] = []
    seen: set[str] = set()
    for n, conv in enumerate(conversations):
        if not isinstance(conv, Mapping):
            skipped.append((f"<row {n}>", "not a mapping"))
            continue
        cid = str(conv.get("conversation_id") or "").strip()
        if not cid:
            skipped.append((f"<row {n}>", "missing conversation_id"))
            continue
        if cid in seen:
            skipped.append((cid, "duplicate conversation_id"))
            continue
        seen.add(cid)
        sp = str(conv.get("system_prompt") or "").strip()
        if not sp:
            skipped.append((cid, "missing system_prompt"))
            continue
        turns, err = _turns(conv)
        if err is None:
            new, err = build(conv, turns, sp, max_per_conversation)
            rows.extend(new)
        if err is not None:
            skipped.append((cid, err))
    return rows, skipped


def build_next_turn_rows(conversations: list[dict], max_per_conversation: int | None = None) -> list[dict]:
    """``usersim_next_turn`` rows: one per human turn ``k >= 1`` (task_id ``{cid}#t{k}``)."""
    return build_rows_with_skips(NEXT_TURN, conversations, max_per_conversation)[0]


def build_persona_rows(conversations: list[dict], max_per_conversation: int | None = None) -> list[dict]:
    """``usersim_persona`` rows: one per conversation (task_id ``{cid}#persona``)."""
    return build_rows_with_skips(PERSONA, conversations, max_per_conversation)[0]


def build_tom_rows(conversations: list[dict], max_per_conversation: int | None = None) -> list[dict]:
    """``usersim_tom`` rows: one per human turn with reasons (task_id ``{cid}#tom{k}``)."""
    return build_rows_with_skips(TOM, conversations, max_per_conversation)[0]

