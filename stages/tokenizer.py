"""DVC stage ``tokenizer``: the Hugging Face tokenizer folder every model stage uses.

- ``tokenizer.pretrained`` set (paper profile): the tokenizer of that LOCAL checkpoint
  (it must have a chat template) is saved into ``output_dir``. Nothing is downloaded.
- otherwise: a byte-level BPE (:func:`mimesis_lab.tokenizer.train_tokenizer`) is trained
  on the message contents of the ``corpus`` parquet files (train splits only, so no
  validation text shapes the vocabulary) and saved into ``output_dir``.

The saved folder is reloaded and checked on the whole corpus: every conversation goes
through :func:`mimesis_lab.chat.tokenize_many` (incremental rendering, loss mask, and
the full-rendering check), and ``decode(encode(x)) == x`` is checked on every message
content and every rendered conversation. ``metrics/tokenizer.json``: ``rows_in``
(conversations read) = ``rows_out`` + ``rows_quarantined`` (conversations without any
message text, or that the chat template cannot tokenise incrementally), vocabulary
size, corpus characters, tokens per conversation, chars/token, round-trip results and
the sha256 of each written file. A trained tokenizer that does not round-trip fails
the stage (a lossless byte-level BPE is the contract); a pretrained one is reported.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mimesis_lab.chat import tokenize_many
from mimesis_lab.config import Params, TokenizerParams
from mimesis_lab.io import Quarantine, read_parquet
from mimesis_lab.tokenizer import (ChatTemplateError, TokenizerLoadError, load_tokenizer, require_chat_template,
                                   train_tokenizer)
from stages.common import StageError, StageResult, main

STAGE = "tokenizer"
TRAIN_ROLE = "assistant"   # both corpora put the simulated human in the assistant slot
log = logging.getLogger("mimesis.stages")


def read_corpus(paths: list[str], quarantine: Quarantine
                ) -> tuple[int, list[list[dict[str, Any]]], list[tuple[str, int]]]:
    """``(rows_in, conversations, (file, 1-based row) of each)``; conversations without any
    message text are quarantined instead."""
    rows_in = 0
    convs: list[list[dict[str, Any]]] = []
    sources: list[tuple[str, int]] = []
    for path in paths:
        df = read_parquet(path, "corpus file", columns=["messages"], hint="run `dvc repro splits` first")
        for r, msgs in enumerate(df.get_column("messages").to_list(), start=1):
            rows_in += 1
            msgs = msgs or []
            if not any(isinstance(m.get("content"), str) and m["content"].strip() for m in msgs):
                quarantine.add(path, r, "empty: conversation has no message text",
                               json.dumps(msgs, ensure_ascii=False))
                continue
            convs.append(msgs)
            sources.append((path, r))
    return rows_in, convs, sources


def _save(tok: Any, output_dir: Path) -> dict[str, str]:
    """Write the tokenizer folder atomically (temp sibling, then rename); sha256 per file."""
    from mimesis_lab.tracking import file_sha256

    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}-", dir=output_dir.parent))
    try:
        tok.save_pretrained(str(tmp))
        tmp.chmod(0o755)   # mkdtemp creates 0700
        if output_dir.exists():
            shutil.rmtree(output_dir)
        os.replace(tmp, output_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return {f.name: file_sha256(f) for f in sorted(output_dir.iterdir()) if f.is_file()}


def run_tokenizer(cfg: TokenizerParams) -> StageResult:
    quarantine = Quarantine()
    rows_in, convs, sources = read_corpus(cfg.corpus, quarantine)
    contents = [m["content"] for c in convs for m in c if isinstance(m.get("content"), str)]
    if cfg.pretrained:
        try:
            tok = require_chat_template(load_tokenizer(cfg.pretrained), cfg.pretrained)
        except (TokenizerLoadError, ChatTemplateError) as e:
            raise StageError(str(e)) from None
        source = f"pretrained:{cfg.pretrained}"
    else:
        if not contents:
            raise StageError(f"no message text in the corpus {cfg.corpus}: cannot train a tokenizer")
        tok = train_tokenizer(contents, cfg.vocab_size, cfg.min_frequency)
        source = "trained"
    out = Path(cfg.output_dir)
    files = _save(tok, out)
    try:   # everything below uses the folder as the model stages will load it
        tok = require_chat_template(load_tokenizer(out), out)
    except (TokenizerLoadError, ChatTemplateError) as e:
        raise StageError(f"written tokenizer does not load back: {e}") from None

    results = tokenize_many(tok, convs, TRAIN_ROLE, errors="return")
    ok_ids: list[list[int]] = []
    trained = 0
    for (path, row), conv, res in zip(sources, convs, results):
        if isinstance(res, Exception):
            quarantine.add(path, row, f"tokenize_chat: {res}", json.dumps(conv, ensure_ascii=False))
            continue
        ok_ids.append(res[0])
        trained += sum(res[1])
    rows_out = len(ok_ids)

    # round trip: every content, and every rendered conversation
    content_ids = tok(contents, add_special_tokens=False, return_attention_mask=False)["input_ids"] if contents else []
    dec = tok.batch_decode(content_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    content_fail = sum(d != c for d, c in zip(dec, contents))
    ok_convs = [c for c, r in zip(convs, results) if not isinstance(r, Exception)]
    rendered = tok.apply_chat_template(ok_convs, tokenize=False) if ok_convs else []
    dec_r = tok.batch_decode(ok_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    conv_fail = sum(d != r for d, r in zip(dec_r, rendered))
    corpus_chars = sum(map(len, contents))
    content_tokens = sum(map(len, content_ids))
    total_tokens = sum(map(len, ok_ids))
    extra = {
        "source": source,
        "output_dir": str(out),
        "files_sha256": files,
        "vocab_size": len(tok),
        "corpus_files": len(cfg.corpus),
        "corpus_messages": len(contents),
        "corpus_chars": corpus_chars,
        "content_tokens": content_tokens,
        "chars_per_token": round(corpus_chars / content_tokens, 4) if content_tokens else 0.0,
        "conversation_tokens": total_tokens,
        "mean_tokens_per_conversation": round(total_tokens / rows_out, 2) if rows_out else 0.0,
        "max_tokens_per_conversation": max(map(len, ok_ids), default=0),
        "trained_tokens": trained,
        "trained_token_fraction": round(trained / total_tokens, 4) if total_tokens else 0.0,
        "roundtrip": {
            "contents_checked": len(contents),
            "contents_failed": content_fail,
            "conversations_checked": len(rendered),
            "conversations_failed": conv_fail,
            "ok": content_fail == 0 and conv_fail == 0,
        },
    }
    if not extra["roundtrip"]["ok"]:
        msg = (f"decode(encode(x)) != x for {content_fail}/{len(contents)} contents and "
               f"{conv_fail}/{len(rendered)} rendered conversations")
        if source == "trained":
            raise StageError(f"trained tokenizer is not lossless: {msg}")
        log.warning("%s: pretrained tokenizer %s", STAGE, msg)
    return StageResult(outputs={}, rows_in=rows_in, rows_out=rows_out, quarantine=quarantine,
                       inputs=[Path(p) for p in cfg.corpus], extra=extra)


def build(params: Params) -> StageResult:
    return run_tokenizer(params.tokenizer)


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main(STAGE, build, lambda p: p.tokenizer))
