"""Format check of a ThoughtTrace-SFT simulator (SPEC §2.2): does it think before it speaks?

For every assistant (simulator) turn of the validation conversations, the model greedily
continues the public history and we record whether the reply opens a ``<think>`` block
and closes it with ``</think>`` before the end of its turn. Reported as rates; prompts
that do not fit the context are counted as skipped, never silently dropped.

:func:`sampled_format_rates` samples instead, with simulator RL's settings (``params.sim_rl.rollout``), and
checks every reply with the RL's own parser: the rate that decides whether RL gets any reward signal (a format
failure's update reward is 0).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from mimesis_lab.io import read_parquet


def classify_reply(text: str) -> tuple[bool, bool]:
    """``(opened, opened_and_closed)`` for a generated reply (special tokens kept in ``text``)."""
    body = text.lstrip()
    opened = body.startswith("<think>")
    return opened, opened and "</think>" in body[len("<think>"):]


def format_rates(model: Any, tokenizer: Any, conversations: Sequence[Sequence[dict]], *,
                 max_new_tokens: int = 96, max_prompts: int | None = None) -> dict[str, Any]:
    """Greedy replies at every assistant turn; rates of opened / opened-and-closed think blocks."""
    model.eval()
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    eos = [eot] if isinstance(eot, int) and eot >= 0 else None
    limit = getattr(model.config, "max_position_embeddings", 2048) - max_new_tokens
    n = opened = closed = skipped = 0
    examples: list[str] = []
    for conv in conversations:
        for k, msg in enumerate(conv):
            if msg["role"] != "assistant":
                continue
            if max_prompts is not None and n >= max_prompts:
                break
            prompt = tokenizer.apply_chat_template(list(conv[:k]), add_generation_prompt=True, tokenize=False)
            ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
            if ids.shape[1] > limit:
                skipped += 1
                continue
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                                     pad_token_id=tokenizer.pad_token_id, attention_mask=torch.ones_like(ids))
            text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=False)
            o, c = classify_reply(text)
            n += 1
            opened += o
            closed += c
            if len(examples) < 3:
                examples.append(text[:200])
    return {
        "prompts": n,
        "skipped_too_long": skipped,
        "think_open_rate": opened / n if n else float("nan"),
        "think_open_close_rate": closed / n if n else float("nan"),
        "examples": examples,
    }


def sampled_format_rates(model: Any, tokenizer: Any, conversations: Sequence[Sequence[dict]], *, temperature: float,
                         top_p: float, max_new_tokens: int, n_samples: int = 64, seed: int = 0,
                         batch_size: int = 16) -> dict[str, Any]:
    """Sampled replies, as simulator RL samples them (same backend, temperature, top_p and max_new_tokens): the
    share that :func:`~mimesis_lab.envs.output_format.parse_reply` accepts as ``<think>…</think>utterance``.

    The prompts are the public histories before every assistant turn that fit the context; ``n_samples`` samples
    cycle over them (``max(n_samples, prompts)`` in all, the ``i``-th on prompt ``i mod P``, seed ``seed + i``).
    A failed generation is counted in ``generation_errors`` and left out. ``per_prompt`` holds
    ``[well_formed, samples]`` per prompt (the report bootstraps over prompts)."""
    from mimesis_lab.envs.output_format import parse_reply
    from mimesis_lab.rollout.backends import SamplingParams, TransformersBackend

    limit = getattr(model.config, "max_position_embeddings", 2048) - max_new_tokens
    prompts, skipped = [], 0
    for conv in conversations:
        for k, msg in enumerate(conv):
            if msg["role"] == "assistant":
                ids = tokenizer.apply_chat_template(list(conv[:k]), add_generation_prompt=True, tokenize=False)
                ids = tokenizer(ids, add_special_tokens=False).input_ids
                if len(ids) > limit:
                    skipped += 1
                else:
                    prompts.append(ids)
    if not prompts:
        raise ValueError("no validation prompt fits the context: nothing to sample")
    n = max(n_samples, len(prompts))
    gens = TransformersBackend(model, tokenizer, batch_size=batch_size).generate_ids(
        [prompts[i % len(prompts)] for i in range(n)],
        SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed))
    per = [[0, 0] for _ in prompts]
    errors: dict[str, int] = {}
    gen_errors = 0
    examples: list[str] = []
    failed: list[str] = []
    for i, g in enumerate(gens):
        if not g.ok:
            gen_errors += 1
            continue
        parsed = parse_reply(g.text, require_think=True)
        per[i % len(prompts)][0] += int(parsed.ok)
        per[i % len(prompts)][1] += 1
        if not parsed.ok:
            errors[parsed.error or "?"] = errors.get(parsed.error or "?", 0) + 1
            if len(failed) < 5:
                failed.append(g.text[:300])
        if len(examples) < 3:
            examples.append(g.text[:200])
    done = sum(p[1] for p in per)
    ok = sum(p[0] for p in per)
    return {"samples": done, "well_formed": ok, "rate": ok / done if done else float("nan"), "prompts": len(prompts),
            "skipped_too_long": skipped, "generation_errors": gen_errors, "error_counts": dict(sorted(errors.items())),
            "per_prompt": per, "temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens,
            "seed": seed, "examples": examples, "failed_examples": failed}


def public_histories(conversations: Sequence[Sequence[dict]], role: str = "assistant") -> list[list[dict]]:
    """The conversations with every ``role`` turn reduced to its public text (think blocks removed): the
    prompts ``conv[:k]`` are then the histories simulator RL and the gyms show the simulator."""
    from mimesis_lab.envs.output_format import public_text

    return [[dict(m, content=public_text(m["content"])) if m["role"] == role else dict(m) for m in conv]
            for conv in conversations]


def evaluate_folder(model_dir: str | Path, val_parquet: str | Path, sampling: Any = None, seed: int = 0,
                    history: str = "full", **kw: Any) -> dict[str, Any]:
    """:func:`format_rates` (greedy) for a saved HF folder on a split parquet (column ``messages``); with
    ``sampling`` (``params.sim_rl.rollout``: temperature, top_p, max_new_tokens) also
    :func:`sampled_format_rates`, under ``sampled``. ``history="public"``: the prompts hold the simulator's
    earlier turns as public text (:func:`public_histories`), as it was trained (``sft.history``)."""
    from mimesis_lab.models import load_model
    from mimesis_lab.tokenizer import load_tokenizer

    model = load_model(model_dir)
    tok = load_tokenizer(model_dir)
    convs = read_parquet(val_parquet, "validation split", columns=["messages"]).get_column("messages").to_list()
    if not convs:
        raise ValueError(f"{val_parquet}: empty split, nothing to evaluate")
    if history == "public":
        convs = public_histories(convs)
    elif history != "full":
        raise ValueError(f"history must be 'full' or 'public', got {history!r}")
    out = format_rates(model, tok, convs, **kw)
    if sampling is not None:
        out["sampled"] = sampled_format_rates(model, tok, convs, temperature=sampling.temperature,
                                              top_p=sampling.top_p, max_new_tokens=sampling.max_new_tokens, seed=seed)
    return out
