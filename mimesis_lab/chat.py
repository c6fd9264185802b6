"""Chat data transforms: the role swap for user-side mid-training (SPEC §2.1).

Pure functions on lists of ``{"role", "content"}`` messages, plus the vectorised
polars form used by the ``role_swap`` stage. Both give identical results (tested).
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import polars as pl

ROLES = ("system", "user", "assistant")
_SWAP = {"user": "assistant", "assistant": "user"}

#: Chat-template tokens and think tags (those of :mod:`mimesis_lab.tokenizer`, which Qwen's templates
#: share). Inside public text they would split a rendered turn, or turn a human message into a
#: reasoning block of an SFT target; the data stages quarantine such rows (:func:`markup_reason`).
MARKUP_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>")
MARKUP_PATTERN = "|".join(re.escape(t) for t in MARKUP_TOKENS)
_MARKUP_RE = re.compile(MARKUP_PATTERN)


def find_markup(text: str) -> str | None:
    """The first chat-template token or think tag in ``text``, or ``None``."""
    m = _MARKUP_RE.search(text)
    return m.group(0) if m else None


def markup_reason(messages: str, content: str = "content", role: str = "role") -> pl.Expr:
    """Per row, null or ``markup: `{messages}[i].{content}` ({role} turn) contains '<tok>'`` for the
    first message of the list[struct] column ``messages`` whose ``content`` holds a
    :data:`MARKUP_TOKENS` string (vectorised :func:`find_markup`)."""
    text = pl.element().struct.field(content)
    hit = pl.col(messages).list.eval(text.str.contains(MARKUP_PATTERN).fill_null(False))
    at = hit.list.arg_max()
    msg = pl.col(messages).list.get(at, null_on_oob=True)
    return pl.when(hit.list.any().fill_null(False)).then(pl.format(
        "markup: `{}[{}].{}` ({} turn) contains the chat-template token or think tag '{}'",
        pl.lit(messages), at, pl.lit(content), msg.struct.field(role),
        msg.struct.field(content).str.extract(f"({MARKUP_PATTERN})", 1)))


def strip_markup(text: pl.Expr) -> pl.Expr:
    """``text`` (a string expression) without any :data:`MARKUP_TOKENS` string (the ``clean`` setting of
    ``role_swap.markup`` / ``thoughttrace.markup``)."""
    return text.str.replace_all(MARKUP_PATTERN, "")


def strip_markup_messages(messages: str, content: str = "content", notes: tuple[str, ...] = ()) -> pl.Expr:
    """The list[struct] column ``messages`` with :func:`strip_markup` applied to every message's
    ``content`` and to the ``content`` of every note in its ``notes`` list fields (ThoughtTrace's
    ``reasons``/``reactions``)."""
    fields = [strip_markup(pl.field(content))]
    fields += [pl.field(n).list.eval(pl.element().struct.with_fields(strip_markup(pl.field("content"))))
               for n in notes]
    return pl.col(messages).list.eval(pl.element().struct.with_fields(*fields)).alias(messages)


def empty_turn_reason(messages: str, human: str = "user", content: str = "content", role: str = "role") -> pl.Expr:
    """Per row, null or ``empty human turn: `{messages}[i].{content}` is empty or whitespace only``
    for the first message of role ``human`` without text (vectorised)."""
    el = pl.element().struct
    empty = pl.col(messages).list.eval(
        ((el.field(role) == human) & (el.field(content).str.strip_chars().str.len_chars() == 0)).fill_null(False))
    return pl.when(empty.list.any().fill_null(False)).then(pl.format(
        "empty human turn: `{}[{}].{}` ({} turn) is empty or whitespace only",
        pl.lit(messages), empty.list.arg_max(), pl.lit(content), pl.lit(human)))


def role_swap(messages: Sequence[Mapping[str, Any]], swap: bool = True) -> list[dict[str, Any]]:
    """Swap the user and assistant roles, keeping system messages (SPEC §2.1).

    The human's turns move to the generated ``assistant`` slot (loss mask 1 later),
    the AI's answers move to the ``user`` context slot. ``swap=False`` is the
    no-swap processor: a copy with the roles unchanged. Every other key of a message
    is copied as is. An unknown role raises ``ValueError`` naming its index.
    """
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        role = msg.get("role")
        if role not in ROLES:
            raise ValueError(f"message {i}: unknown role {role!r} (expected one of {ROLES})")
        new = dict(msg)
        if swap and role in _SWAP:
            new["role"] = _SWAP[role]
        out.append(new)
    return out


def swap_roles_expr(messages: str = "messages") -> pl.Expr:
    """Polars expression applying :func:`role_swap` (``swap=True``) to a list[struct{role,…}] column."""
    return pl.col(messages).list.eval(
        pl.element().struct.with_fields(pl.field("role").replace(_SWAP))
    )


def role_swap_frame(df: pl.DataFrame, messages: str = "messages", swap: str = "swap") -> pl.DataFrame:
    """Vectorised role swap: rows with ``swap`` true are swapped, the others copied unchanged."""
    return df.with_columns(
        pl.when(pl.col(swap)).then(swap_roles_expr(messages)).otherwise(pl.col(messages)).alias(messages)
    )


# --------------------------------------------------------------------------------------
# Incremental chat tokenisation with a loss mask (SPEC §2.1 "Tokenisation", DESIGN §4)
# --------------------------------------------------------------------------------------
#
# Convention (any Hugging Face tokenizer with a chat template):
#
# * A conversation ``m`` of ``n`` messages is rendered as its prefixes
#   ``P[k] = tokenizer.apply_chat_template(m[:k], tokenize=False)`` (``P[0] = ""``).
#   Message ``k`` owns the text increment ``P[k+1][len(P[k]):]`` (anything a template
#   writes before the first message belongs to message 0), which is tokenised on its own
#   (``add_special_tokens=False``); the ids are concatenated. Each ``P[k+1]`` must start
#   with ``P[k]`` and the concatenated ids must equal the ids of the full rendering
#   ``P[n]``; otherwise ``ValueError`` naming the message.
# * In the increment of a ``train_role`` message, the content span is found generically:
#   (1) the content string, if it occurs exactly once in the increment; else (2) the
#   header/footer obtained by rendering the same prefix with the content replaced by a
#   sentinel (handles templates that reformat the content, e.g. Qwen3's think block),
#   if they frame the increment; else (3) the stripped content, if it occurs exactly
#   once (templates that ``trim``). No span -> ``ValueError``.
# * loss_mask is 1 on
#     - every token overlapping the content span (the ``<think>…</think>`` block is
#       part of the content), and
#     - the tokens after the content up to and including the LAST special token of the
#       message's increment: its end-of-turn token (``<|im_end|>`` in ChatML/Qwen,
#       ``<|eot_id|>`` in Llama-3, ``<end_of_turn>`` in Gemma, ``</s>``…). What follows
#       it (ChatML's trailing ``\n``) is 0: generation stops at the end-of-turn token,
#       so the model is never asked to emit that newline. If nothing after the content
#       is a special token, all of it is 1 (it is then the only end-of-turn signal);
#   and 0 everywhere else: the role header (``<|im_start|>assistant\n``), all tokens of
#   messages of other roles, anything a template writes before the first message.
#   Special tokens = ``tokenizer.all_special_ids`` + added tokens flagged ``special``.
# * Fast tokenizers place tokens by their character offsets (a token straddling the
#   header/content boundary counts as content, like transformers'
#   ``return_assistant_tokens_mask``); a tokenizer without offsets tokenises header,
#   content and footer separately and the full-rendering check guarantees that those
#   pieces equal the real ids.

_SENTINEL = "MIMESISCONTENTSENTINEL7f3a9c"


def _special_ids(tokenizer: Any) -> frozenset[int]:
    ids = set(getattr(tokenizer, "all_special_ids", None) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(i for i, t in decoder.items() if getattr(t, "special", False))
    return frozenset(ids)


def _check_template(tokenizer: Any) -> None:
    if not getattr(tokenizer, "chat_template", None):
        from mimesis_lab.tokenizer import ChatTemplateError

        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ChatTemplateError(f"{name}: tokenizer has no chat template; chat tokenisation needs one")


def _check_messages(messages: Sequence[Mapping[str, Any]], train_role: str) -> list[Mapping[str, Any]]:
    if len(messages) == 0:
        raise ValueError("empty conversation: nothing to tokenize")
    msgs = list(messages)
    for k, m in enumerate(msgs):
        if m.get("role") == train_role and not isinstance(m.get("content"), str):
            raise ValueError(f"message {k}: content of a {train_role!r} message must be a string, "
                             f"got {type(m.get('content')).__name__}")
    return msgs


def _first_diff(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _increments(rendered: Sequence[str]) -> list[str]:
    """Text increments of the prefix renderings ``rendered[k] = P[k+1]`` (raises on a non-prefix)."""
    incs: list[str] = []
    prev = ""
    for k, cur in enumerate(rendered):
        if not cur.startswith(prev):
            at = _first_diff(prev, cur)
            raise ValueError(
                f"message {k}: the rendering of messages[:{k + 1}] does not extend the rendering of "
                f"messages[:{k}] (they differ at char {at}: {prev[at:at + 40]!r} vs {cur[at:at + 40]!r}); "
                "the chat template renders earlier messages differently once more follow")
        incs.append(cur[len(prev):])
        prev = cur
    return incs


def _span_of(inc: str, content: str) -> tuple[int, int] | None:
    if content and inc.count(content) == 1:
        a = inc.find(content)
        return a, a + len(content)
    return None


def _span_by_sentinel(inc: str, prev: str, sentinel_render: str) -> tuple[int, int] | None:
    if not sentinel_render.startswith(prev):
        return None
    s_inc = sentinel_render[len(prev):]
    if s_inc.count(_SENTINEL) != 1:
        return None
    head, foot = s_inc.split(_SENTINEL)
    if len(head) + len(foot) <= len(inc) and inc.startswith(head) and inc.endswith(foot):
        return len(head), len(inc) - len(foot)
    return None


def _sentinel_request(msgs: Sequence[Mapping[str, Any]], k: int) -> list[Mapping[str, Any]]:
    return [*msgs[:k], {**msgs[k], "content": _SENTINEL}]


def _no_span(k: int, train_role: str) -> ValueError:
    return ValueError(f"message {k}: cannot locate the content of this {train_role!r} message in its rendering "
                      "(the chat template rewrites it)")


def _increment_mask(ids: Sequence[int], offsets: Sequence[tuple[int, int]], span: tuple[int, int],
                    special: frozenset[int]) -> list[int]:
    """Mask of one ``train_role`` increment: header = leading tokens ending at or before the
    content start, footer = trailing tokens starting at or after the content end, content =
    the tokens in between (1); footer tokens are 1 up to and including the last special one
    (all of them if none is special)."""
    a, b = span
    n = len(ids)
    h = 0
    while h < n and offsets[h][1] <= a:
        h += 1
    f = n
    while f > h and offsets[f - 1][0] >= b:
        f -= 1
    last = n - 1
    while last >= f and ids[last] not in special:
        last -= 1
    end = last + 1 if last >= f else n
    return [0] * h + [1] * (end - h) + [0] * (n - end)


def _texts_to_encode(incs: Sequence[str], spans: Sequence[tuple[int, int] | None], offsets: bool) -> list[str]:
    """The texts whose ids make up the conversation (header/content/footer pieces without offsets)."""
    if offsets:
        return list(incs)
    out: list[str] = []
    for inc, sp in zip(incs, spans):
        if sp is None:
            out.append(inc)
        else:
            out.extend((inc[: sp[0]], inc[sp[0]: sp[1]], inc[sp[1]:]))
    return out


def _assemble(tokenizer: Any, incs: Sequence[str], spans: Sequence[tuple[int, int] | None],
              enc_ids: Sequence[Sequence[int]], enc_offsets: Sequence[Sequence[tuple[int, int]]] | None,
              full_ids: Sequence[int], special: frozenset[int]) -> tuple[list[int], list[int]]:
    input_ids: list[int] = []
    loss_mask: list[int] = []
    ends: list[int] = []           # cumulative token count after each message
    j = 0
    for inc, sp in zip(incs, spans):
        if sp is None:
            ids = enc_ids[j]
            input_ids.extend(ids)
            loss_mask.extend([0] * len(ids))
            j += 1
        else:
            if enc_offsets is not None:
                ids, offs = list(enc_ids[j]), enc_offsets[j]
                j += 1
            else:
                a, b = sp
                h, c, f = enc_ids[j], enc_ids[j + 1], enc_ids[j + 2]
                j += 3
                ids = [*h, *c, *f]
                offs = [(0, a)] * len(h) + [(a, b)] * len(c) + [(b, len(inc))] * len(f)
            input_ids.extend(ids)
            loss_mask.extend(_increment_mask(ids, offs, sp, special))
        ends.append(len(input_ids))
    if len(input_ids) != len(full_ids) or input_ids != list(full_ids):
        pos = _first_diff(input_ids, full_ids)
        k = next((i for i, e in enumerate(ends) if pos < e), len(incs) - 1)
        got = tokenizer.convert_ids_to_tokens(input_ids[pos:pos + 3])
        want = tokenizer.convert_ids_to_tokens(list(full_ids[pos:pos + 3]))
        raise ValueError(
            f"message {k}: the incrementally tokenized conversation differs from the tokenized full rendering "
            f"at token {pos} ({got!r} vs {want!r}; {len(input_ids)} vs {len(full_ids)} tokens): the tokenizer "
            "merges text across a message boundary")
    return input_ids, loss_mask


def _render(tokenizer: Any, conv: Sequence[Mapping[str, Any]]) -> str:
    try:
        return tokenizer.apply_chat_template(list(conv), tokenize=False)
    except Exception as e:   # jinja2 TemplateError (raise_exception), TypeError, ...
        raise ValueError(f"chat template failed on messages[:{len(conv)}]: {type(e).__name__}: {e}") from e


def tokenize_chat(tokenizer: Any, messages: Sequence[Mapping[str, Any]],
                  train_role: str = "assistant") -> tuple[list[int], list[int]]:
    """Token ids and loss mask of one conversation, rendered turn by turn (SPEC §2.1).

    Each prefix ``messages[:k+1]`` is rendered with ``tokenizer.apply_chat_template(…,
    tokenize=False)``; the text increment of message ``k`` is tokenised on its own and
    the ids accumulated. ``loss_mask`` is 1 only on the content tokens of ``train_role``
    messages (their ``<think>`` block included) and on their end-of-turn token, never on
    their role header (full convention in the comment above). Raises ``ValueError``
    naming the message if a rendering does not extend the previous one, if a content
    cannot be located, or if the accumulated ids differ from tokenising the full
    rendering (and when the template itself fails); :class:`mimesis_lab.tokenizer.ChatTemplateError` without a chat template.
    """
    _check_template(tokenizer)
    msgs = _check_messages(messages, train_role)
    incs = _increments([_render(tokenizer, msgs[: k + 1]) for k in range(len(msgs))])
    spans: list[tuple[int, int] | None] = [None] * len(msgs)
    prev = ""
    for k, m in enumerate(msgs):
        if m.get("role") == train_role:
            span = _span_of(incs[k], m["content"])
            if span is None:
                span = _span_by_sentinel(incs[k], prev, _render(tokenizer, _sentinel_request(msgs, k)))
            if span is None:
                span = _span_of(incs[k], m["content"].strip())
            if span is None:
                raise _no_span(k, train_role)
            spans[k] = span
        prev += incs[k]
    offsets = bool(getattr(tokenizer, "is_fast", False))
    enc_ids, enc_offs = [], []
    for text in _texts_to_encode(incs, spans, offsets):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=offsets)
        enc_ids.append(enc["input_ids"])
        if offsets:
            enc_offs.append(enc["offset_mapping"])
    full_ids = tokenizer(prev, add_special_tokens=False)["input_ids"]
    return _assemble(tokenizer, incs, spans, enc_ids, enc_offs if offsets else None, full_ids,
                     _special_ids(tokenizer))


def _render_batch(tokenizer: Any, requests: list[list[Mapping[str, Any]]], owners: list[int],
                  fail: Any) -> list[str | None]:
    """Render all requests in one batched call; on failure, per request, reporting the owner."""
    if not requests:
        return []
    try:
        return list(tokenizer.apply_chat_template(requests, tokenize=False))
    except Exception:
        out: list[str | None] = []
        for req, i in zip(requests, owners):
            try:
                out.append(_render(tokenizer, req))
            except ValueError as e:
                fail(i, e)
                out.append(None)
        return out


def tokenize_many(tokenizer: Any, conversations: Sequence[Sequence[Mapping[str, Any]]],
                  train_role: str = "assistant", *, errors: str = "raise") -> list[Any]:
    """:func:`tokenize_chat` for many conversations, batched; same results (tested).

    The prefix renderings of all conversations go through one batched
    ``apply_chat_template`` call (plus one for the sentinel renderings, only if a
    content cannot be found verbatim), and all increments plus all full renderings
    (identical texts once) through ONE ``tokenizer(texts, add_special_tokens=False)``
    call, the Rust batch path; token offsets are read from the returned encodings only
    for the increments that need a mask. ``errors="raise"`` (default) raises the ``ValueError`` of
    the first failing conversation, prefixed ``conversation {i}:``; with
    ``errors="return"`` that ``ValueError`` takes the conversation's slot instead of an
    ``(input_ids, loss_mask)`` tuple.
    """
    if errors not in ("raise", "return"):
        raise ValueError(f"errors must be 'raise' or 'return', got {errors!r}")
    _check_template(tokenizer)
    n = len(conversations)
    results: list[Any] = [None] * n
    alive = [True] * n

    def fail(i: int, e: Exception) -> None:
        if not alive[i]:
            return
        err = ValueError(f"conversation {i}: {e}")
        if errors == "raise":
            raise err from e
        results[i] = err
        alive[i] = False

    msgs_of: list[list[Mapping[str, Any]]] = [[] for _ in range(n)]
    requests: list[list[Mapping[str, Any]]] = []
    owners: list[int] = []
    for i, conv in enumerate(conversations):
        try:
            msgs_of[i] = _check_messages(conv, train_role)
        except ValueError as e:
            fail(i, e)
            continue
        msgs = msgs_of[i]
        requests.extend(msgs[: k + 1] for k in range(len(msgs)))
        owners.extend([i] * len(msgs))
    rendered = _render_batch(tokenizer, requests, owners, fail)

    incs_of: list[list[str]] = [[] for _ in range(n)]
    spans_of: list[list[tuple[int, int] | None]] = [[] for _ in range(n)]
    sentinel_req: list[list[Mapping[str, Any]]] = []
    sentinel_at: list[tuple[int, int, str]] = []     # (conversation, message, previous prefix)
    pos = 0
    for i in range(n):
        msgs = msgs_of[i]
        mine, pos = rendered[pos:pos + len(msgs)], pos + len(msgs)
        if not alive[i]:
            continue
        try:
            incs = incs_of[i] = _increments(mine)  # type: ignore[arg-type]
        except ValueError as e:
            fail(i, e)
            continue
        spans = spans_of[i] = [None] * len(msgs)
        prev = ""
        for k, m in enumerate(msgs):
            if m.get("role") == train_role:
                spans[k] = _span_of(incs[k], m["content"])
                if spans[k] is None:
                    sentinel_req.append(_sentinel_request(msgs, k))
                    sentinel_at.append((i, k, prev))
            prev += incs[k]
    for (i, k, prev), s in zip(sentinel_at, _render_batch(tokenizer, sentinel_req,
                                                          [i for i, _, _ in sentinel_at], fail)):
        if not alive[i]:
            continue
        inc, content = incs_of[i][k], msgs_of[i][k]["content"]
        span = _span_by_sentinel(inc, prev, s) if s is not None else None
        if span is None:
            span = _span_of(inc, content.strip())
        if span is None:
            fail(i, _no_span(k, train_role))
            continue
        spans_of[i][k] = span

    offsets = bool(getattr(tokenizer, "is_fast", False))
    index: dict[str, int] = {}       # identical texts are tokenised once
    plans: list[tuple[list[int], int] | None] = [None] * n
    for i in range(n):
        if alive[i]:
            texts = _texts_to_encode(incs_of[i], spans_of[i], offsets)
            plans[i] = ([index.setdefault(t, len(index)) for t in texts],
                        index.setdefault("".join(incs_of[i]), len(index)))
    if not index:
        return results
    # ONE batched call (Rust) for all increments and all full renderings; the offsets are
    # read from the Rust encodings only for the increments of train_role messages.
    enc = tokenizer(list(index), add_special_tokens=False, return_attention_mask=False)
    all_ids = enc["input_ids"]
    encodings = enc.encodings if offsets else None
    if offsets and encodings is None:
        raise TypeError(f"{type(tokenizer).__name__}: is_fast but returned no encodings (offsets)")
    special = _special_ids(tokenizer)
    for i, plan in enumerate(plans):
        if plan is None:
            continue
        parts, full = plan
        offs = None
        if encodings is not None:
            offs = [encodings[j].offsets if sp is not None else None for j, sp in zip(parts, spans_of[i])]
        try:
            results[i] = _assemble(tokenizer, incs_of[i], spans_of[i], [all_ids[j] for j in parts], offs,
                                   all_ids[full], special)
        except ValueError as e:
            fail(i, e)
    return results
