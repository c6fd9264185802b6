"""The project's tokenizer: a small byte-level BPE with a Qwen-style (ChatML) chat template.

- :data:`CHAT_TEMPLATE` renders each message as ``<|im_start|>{role}\\n{content}<|im_end|>\\n``;
  ``add_generation_prompt`` appends ``<|im_start|>assistant\\n``. Content is rendered
  verbatim (``<think>…</think>`` blocks included: the simulator targets are
  ``<think>{reasons}</think>{utterance}``); no default system prompt is injected.
- :func:`train_tokenizer` trains the BPE with the ``tokenizers`` library (ByteLevel
  pre-tokenizer and decoder, no normaliser, so ``decode(encode(x)) == x``); specials
  ``<|endoftext|>`` (pad, id 0), ``<|im_start|>`` (1), ``<|im_end|>`` (eos, 2); ``<think>``
  and ``</think>`` are added (non-special) tokens with the last two ids, so they are
  single ids and survive ``decode(..., skip_special_tokens=True)``.
- :func:`load_tokenizer` loads a local folder only (``local_files_only=True``), never the
  hub; :func:`require_chat_template` fails clearly on a tokenizer without a template.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, Iterator

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
ADDED_TOKENS = (THINK_OPEN, THINK_CLOSE)

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- endif -%}"
)

# Training text is split on the special/added token strings: they get their own ids and
# must not spend merges of the (small) vocabulary.
_TOKEN_SPLIT = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + ADDED_TOKENS))


class TokenizerLoadError(OSError):
    """A tokenizer folder is missing or unusable (the message names the path)."""


class ChatTemplateError(ValueError):
    """A tokenizer has no chat template."""


def _pieces(texts: Iterable[str]) -> Iterator[str]:
    for text in texts:
        for piece in _TOKEN_SPLIT.split(text):
            if piece:
                yield piece


def train_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` and wrap it with the chat template.

    ``vocab_size`` counts everything (256 byte symbols, merges, the 3 specials and the 2
    think tokens); the result may be smaller when the text has too few pairs with
    ``min_frequency``. Deterministic for the same input (tested).
    """
    n_added = len(ADDED_TOKENS)
    if vocab_size < 256 + len(SPECIAL_TOKENS) + n_added:
        raise ValueError(f"vocab_size={vocab_size} is too small for a byte-level BPE "
                         f"(needs >= {256 + len(SPECIAL_TOKENS) + n_added})")
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - n_added,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(_pieces(texts), trainer=trainer)
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        bos_token=None,
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=1_000_000,
    )


def require_chat_template(tok: PreTrainedTokenizerBase, where: str | os.PathLike | None = None):
    """Return ``tok`` if it has a chat template, else raise :class:`ChatTemplateError`."""
    if not getattr(tok, "chat_template", None):
        name = where or getattr(tok, "name_or_path", "") or type(tok).__name__
        raise ChatTemplateError(
            f"{name}: tokenizer has no chat template (set `chat_template`, or use a checkpoint whose "
            "tokenizer_config.json / chat_template.jinja defines one)")
    return tok


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """Load the tokenizer saved in the local folder ``path`` (never from the hub)."""
    from transformers import AutoTokenizer

    p = Path(path)
    if not p.is_dir():
        raise TokenizerLoadError(f"{p}: tokenizer folder not found (run `dvc repro tokenizer` or fix the path)")
    if not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                                            "vocab.json")):
        raise TokenizerLoadError(f"{p}: not a tokenizer folder (no tokenizer.json / tokenizer_config.json)")
    try:
        return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as e:  # transformers/tokenizers raise many types for a bad folder
        raise TokenizerLoadError(f"{p}: cannot load tokenizer: {type(e).__name__}: {e}") from e
