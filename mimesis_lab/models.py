"""The simulator model: a tiny Qwen3 built from config, or a local Hugging Face checkpoint.

Everything here is local-only: :func:`load_model` refuses anything that is not an existing
folder and always passes ``local_files_only=True`` (no hub id is ever resolved; the project
runs with ``HF_HUB_OFFLINE=1``).

- :func:`build_tiny_model` — a Qwen3-architecture causal LM from the ``model`` section of
  ``params.yaml`` (random init seeded by ``cfg.seed``, fp32, attention dropout 0).
- :func:`load_model` — a local checkpoint folder; any problem becomes :class:`ModelLoadError`
  naming the folder and what is wrong (missing folder/config/weights, corrupt weights,
  weights that do not cover the architecture).
- :func:`build_or_load` — dispatch on ``cfg.init`` (``tiny`` | ``pretrained``).
- :func:`disable_dropout` / :func:`assert_no_dropout` — RL and teacher scoring need a
  deterministic forward: ``logp`` under ``model.train()`` must equal ``logp`` under ``eval()``.
- :func:`save_hf` — ``save_pretrained`` (safetensors) plus the tokenizer, one folder.
"""
from __future__ import annotations

import inspect
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "ModelLoadError",
    "DropoutActiveError",
    "build_tiny_model",
    "load_model",
    "build_or_load",
    "induction_warmup",
    "induction_batch",
    "induction_loss",
    "supports_logits_to_keep",
    "disable_dropout",
    "assert_no_dropout",
    "save_hf",
]

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


class ModelLoadError(RuntimeError):
    """A local checkpoint that cannot be loaded; the message names the path and the problem."""


class DropoutActiveError(RuntimeError):
    """A model that still has a non-zero dropout probability somewhere."""


def build_tiny_model(
    cfg: Any,
    vocab_size: int,
    pad_token_id: int,
    eos_token_id: int,
    bos_token_id: int | None = None,
    attn_implementation: str = "sdpa",
):
    """Build a randomly initialised Qwen3 causal LM from a :class:`~mimesis_lab.config.ModelParams`.

    The initialisation is seeded with ``cfg.seed`` inside a forked RNG, so the same config gives
    bit-identical weights and the caller's global RNG state is left untouched. fp32, attention
    dropout 0, no sliding window.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be > 0, got {vocab_size}")
    for name, tok in (("pad_token_id", pad_token_id), ("eos_token_id", eos_token_id), ("bos_token_id", bos_token_id)):
        if tok is not None and not 0 <= tok < vocab_size:
            raise ValueError(f"{name}={tok} is outside the vocabulary (size {vocab_size})")
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg.rope_theta)},
        tie_word_embeddings=cfg.tie_word_embeddings,
        attention_dropout=0.0,
        use_sliding_window=False,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=bos_token_id,
    )
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = Qwen3ForCausalLM(config)
    model = model.to(torch.float32)
    if hasattr(model, "generation_config") and model.generation_config is not None:
        model.generation_config.pad_token_id = pad_token_id
        model.generation_config.eos_token_id = eos_token_id
        model.generation_config.bos_token_id = bos_token_id
    return disable_dropout(model)


def induction_batch(g: torch.Generator, vocab: int, batch: int, *, min_span: int = 8, max_span: int = 40,
                    max_gap: int = 32, low: int = 100) -> tuple[torch.Tensor, int]:
    """One batch of the induction task: ``batch`` rows ``x · noise · x`` (span length and gap drawn once per
    batch from ``g``, token ids from ``[low, vocab)``) and the position of the repeat's first token."""
    s = int(torch.randint(min_span, max_span + 1, (1,), generator=g))
    gap = int(torch.randint(0, max_gap + 1, (1,), generator=g))
    x = torch.randint(low, vocab, (batch, s), generator=g)
    noise = torch.randint(low, vocab, (batch, gap), generator=g)
    return torch.cat([x, noise, x], dim=1), s + gap


def supports_logits_to_keep(model) -> bool:
    """Whether ``model`` (or the module a DeepSpeed engine wraps) takes ``logits_to_keep`` (transformers' causal
    LMs: the LM head then projects only the kept positions, the largest matmul of a small model)."""
    return _forward_takes(type(getattr(model, "module", model)), "logits_to_keep")


@lru_cache(maxsize=None)
def _forward_takes(cls: type, name: str) -> bool:
    try:
        return name in inspect.signature(cls.forward).parameters
    except (AttributeError, TypeError, ValueError):
        return False


def induction_loss(model, seq: torch.Tensor, start: int) -> torch.Tensor:
    """Mean next-token cross-entropy on the repeat of :func:`induction_batch` after its first token (the only
    tokens that copying predicts); the logits of the other positions are not computed where the model can skip
    them (:func:`supports_logits_to_keep`)."""
    if supports_logits_to_keep(model):
        keep = torch.arange(start, seq.shape[1] - 1, device=seq.device)
        logits = model(input_ids=seq, logits_to_keep=keep).logits
    else:
        logits = model(input_ids=seq).logits[:, start:-1]
    vocab = logits.shape[-1]
    return nn.functional.cross_entropy(logits.reshape(-1, vocab).float(), seq[:, start + 1:].reshape(-1))


def induction_warmup(model, *, steps: int, lr: float = 3e-3, batch: int = 32, min_span: int = 8,
                     max_span: int = 40, max_gap: int = 32, low: int | None = None, seed: int = 0,
                     target: float = 0.0, check_every: int = 100) -> dict[str, float]:
    """Give a randomly initialised causal LM in-context copying (induction heads) before it sees any data.

    Each step draws ``batch`` sequences ``x · noise · x``: ``x`` is a span of ``s`` random token ids from
    ``[low, vocab)`` (``low`` defaults to ``min(100, vocab // 4)``, past the special tokens; ``s`` uniform in ``[min_span, max_span]``), ``noise`` ``g`` random ids (``g`` uniform in
    ``[0, max_gap]``), both drawn per step. The loss is the next-token cross-entropy on the repeat after its
    first token, the only part that is predictable and only by looking the current token up earlier in the
    context and copying its successor: the induction mechanism of Olsson et al. (2022), which a pretrained LM
    brings and a model built from config lacks (:mod:`mimesis_lab.evals.copy_probe` measures it). Because the
    span and the gap vary, a fixed relative position cannot solve it; with one fixed offset the model learns
    that offset, not copying. AdamW (0.9, 0.95), no weight decay, constant ``lr``.

    Measured on the tiny default (2 layers, 128 wide, 4,101 tokens; ``lr`` 3e-3, batch 32, no gap): the probe
    stays at chance for about 600 steps, then rises through a phase change to 0.96 at 1,000 steps (106 s on
    2 CPU cores; a later run: 0.956 at 800 steps, 0.987 on 30-token spans and 0.953 on 60 at 900). With ``lr``
    6e-3 the plateau is shorter (0.986 at 700 steps), but the result fine-tunes worse (mid-training val loss 3.97
    instead of 2.93); shorter spans and gaps (max span 24, gap 16) stay near chance for 1,300 steps.

    ``target`` > 0 stops early: every ``check_every`` steps the copy probe
    (:func:`mimesis_lab.evals.copy_probe.induction_accuracy`, 30-token spans, its own seed) is measured and the
    warm-up ends once it reaches ``target``; ``steps`` is then the most it runs. The probe draws from its own
    generator, so the steps run are the same as without it and the result stays deterministic.

    Trains ``model`` in place (its mode is restored); the RNG is local (``seed``), so the caller's RNG state is
    untouched and the result is deterministic. Returns ``{"steps", "loss_first", "loss_last"}`` (``steps``:
    those run) and, with a ``target``, ``"probe"`` (the last probe accuracy).
    """
    if steps < 1 or batch < 1 or not 2 <= min_span <= max_span or max_gap < 0 or check_every < 1 \
            or not 0.0 <= target <= 1.0:
        raise ValueError(f"induction_warmup needs steps, batch, check_every >= 1, 2 <= min_span <= max_span, "
                         f"max_gap >= 0, 0 <= target <= 1 (got steps={steps}, batch={batch}, span=[{min_span}, "
                         f"{max_span}], max_gap={max_gap}, check_every={check_every}, target={target})")
    vocab = int(model.get_input_embeddings().weight.shape[0])
    low = min(100, vocab // 4) if low is None else low
    if not 0 <= low < vocab - 1:
        raise ValueError(f"low={low} leaves no token ids below the vocabulary size {vocab}")
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(int(seed) + 7919)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    was_training = model.training
    model.train()
    if target > 0:
        from mimesis_lab.evals.copy_probe import induction_accuracy   # it restores the model's mode itself
    losses: list[float] = []
    probe: float | None = None
    try:
        for step in range(1, steps + 1):
            seq, start = induction_batch(g, vocab, batch, min_span=min_span, max_span=max_span, max_gap=max_gap,
                                         low=low)
            loss = induction_loss(model, seq.to(device), start)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if target > 0 and step % check_every == 0 and step < steps:
                probe = float(induction_accuracy(model, vocab, low=low)["acc"])
                if probe >= target:
                    break
            else:
                probe = None            # trained past the last check: measured again at the end
    finally:
        model.train(was_training)
        model.zero_grad(set_to_none=True)
    out = {"steps": len(losses), "loss_first": losses[0], "loss_last": float(sum(losses[-20:]) / len(losses[-20:]))}
    if target > 0:
        out["probe"] = probe if probe is not None else float(induction_accuracy(model, vocab, low=low)["acc"])
    return out


def warmup_cache_dir() -> Path:
    """Where warmed-up tiny models are kept: ``$MIMESIS_WARMUP_CACHE``, else ``<project>/.mimesis/warmup_cache``."""
    import os

    env = os.environ.get("MIMESIS_WARMUP_CACHE")
    return Path(env) if env else Path(__file__).resolve().parent.parent / ".mimesis" / "warmup_cache"


def warmup_key(cfg: Any, build: tuple) -> str:
    """sha256 of what the warm-up's result depends on: the model section, the build arguments (vocabulary size,
    special ids, attention), the code of this module and the torch version."""
    import hashlib

    import transformers

    from mimesis_lab.code_deps import code_identity

    doc = {"model": cfg.model_dump() if hasattr(cfg, "model_dump") else dict(vars(cfg)), "build": list(build),
           "code": code_identity("mimesis_lab.models"), "torch": torch.__version__,
           "transformers": transformers.__version__}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _warmed_up(model, cfg: Any, build: tuple) -> None:
    """Run :func:`induction_warmup` on the fresh ``model`` per ``cfg``, or load its result from the warm-up
    cache (:func:`warmup_cache_dir`, keyed by :func:`warmup_key`): the same weights, without paying the
    minutes again in a later phase that builds the same base (sim_eval's `base` simulator) or a rerun.
    A damaged cache file is recomputed and replaced."""
    import os
    import sys
    import time

    from safetensors.torch import load_model as st_load_model
    from safetensors.torch import save_model as st_save_model

    path = warmup_cache_dir() / f"{warmup_key(cfg, build)}.safetensors"
    if path.is_file():
        try:
            st_load_model(model, str(path), strict=True)   # tied embeddings: saved once, tied on load
            print(f"induction warm-up: loaded {path}", file=sys.stderr, flush=True)
            return
        except Exception as e:  # noqa: BLE001 - a torn or foreign file: recompute
            print(f"induction warm-up: {path} unreadable ({type(e).__name__}: {e}); recomputing", file=sys.stderr,
                  flush=True)
    steps = int(cfg.induction_warmup_steps)
    t0 = time.perf_counter()   # minutes on CPU: say so, and how it went (a user would otherwise see a silent job)
    target = float(cfg.induction_warmup_target)
    print(f"induction warm-up of the tiny model: {'at most ' if target else ''}{steps} steps"
          f"{f' (until the copy probe reaches {target:g})' if target else ''} ...", file=sys.stderr, flush=True)
    res = induction_warmup(model, steps=steps, lr=cfg.induction_warmup_lr, batch=cfg.induction_warmup_batch,
                           max_gap=cfg.induction_warmup_max_gap, seed=cfg.seed, target=target)
    probe = f", copy probe {res['probe']:.3f}" if "probe" in res else ""
    print(f"induction warm-up done in {time.perf_counter() - t0:.0f} s ({res['steps']} steps): copy-task loss "
          f"{res['loss_first']:.3f} -> {res['loss_last']:.3f}{probe}", file=sys.stderr, flush=True)
    if target and res.get("probe", 0.0) < target:
        print(f"induction warm-up: the copy probe {res['probe']:.3f} is below its target {target:g} after "
              f"{steps} steps (raise model.induction_warmup_steps or the lr)", file=sys.stderr, flush=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        st_save_model(model, str(tmp))
        os.replace(tmp, path)
    except OSError as e:   # a read-only project: the warm-up stands, only the cache is skipped
        print(f"induction warm-up: not cached ({e})", file=sys.stderr, flush=True)


def _check_folder(path: Path) -> None:
    if not path.exists():
        raise ModelLoadError(f"{path}: model folder does not exist")
    if not path.is_dir():
        raise ModelLoadError(f"{path}: not a folder (expected a Hugging Face checkpoint folder)")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelLoadError(f"{path}: missing config.json")
    try:
        json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: corrupt config.json ({e})") from None
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise ModelLoadError(f"{path}: no weights (expected one of {', '.join(WEIGHT_FILES)})")
    single = path / "model.safetensors"
    if single.is_file():
        try:
            from safetensors import safe_open

            with safe_open(str(single), framework="pt") as f:
                list(f.keys())
        except Exception as e:  # safetensors raises its own SafetensorError / OSError
            raise ModelLoadError(f"{path}: corrupt weights in {single.name} ({type(e).__name__}: {e})") from None


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, attn_implementation: str | None = None):
    """Load a causal LM from a local Hugging Face checkpoint folder (never from the hub).

    Raises :class:`ModelLoadError` naming ``path`` when the folder, its ``config.json`` or its
    weights are missing or corrupt, or when the weights leave parameters uninitialised.
    """
    from transformers import AutoModelForCausalLM

    path = Path(path).expanduser().resolve()
    _check_folder(path)
    kwargs: dict[str, Any] = {"local_files_only": True, "dtype": dtype, "output_loading_info": True}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model, info = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(f"{path}: cannot load checkpoint ({type(e).__name__}: {e})") from None
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        shown = ", ".join(missing[:5]) + (" …" if len(missing) > 5 else "")
        raise ModelLoadError(f"{path}: weights do not cover the model; missing {len(missing)} tensors: {shown}")
    mismatched = info.get("mismatched_keys") or []
    if mismatched:
        raise ModelLoadError(f"{path}: {len(mismatched)} tensors have the wrong shape, e.g. {list(mismatched)[:3]}")
    model.eval()
    return model


def build_or_load(cfg: Any, tokenizer, attn_implementation: str = "sdpa"):
    """``cfg.init == "tiny"``: build from ``cfg`` sized to ``tokenizer``; ``"pretrained"``: load ``cfg.pretrained_path``.

    The tiny model's vocabulary is ``len(tokenizer)`` (added special tokens included); its pad id
    is the tokenizer's pad id, falling back to eos. A pretrained checkpoint whose embedding table
    is smaller than the tokenizer is rejected (token ids would index past it).
    """
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    if cfg.init == "tiny":
        if eos is None:
            raise ValueError("the tokenizer has no eos token; the tiny model needs one")
        model = build_tiny_model(cfg, len(tokenizer), pad, eos, tokenizer.bos_token_id, attn_implementation)
        steps = int(getattr(cfg, "induction_warmup_steps", 0) or 0)
        if steps > 0:
            _warmed_up(model, cfg, (len(tokenizer), pad, eos, tokenizer.bos_token_id, attn_implementation))
        return model
    if cfg.init == "pretrained":
        if not cfg.pretrained_path:
            raise ModelLoadError("model.init = pretrained needs model.pretrained_path")
        model = load_model(cfg.pretrained_path, attn_implementation=attn_implementation)
        n_emb = model.get_input_embeddings().weight.shape[0]
        if len(tokenizer) > n_emb:
            raise ModelLoadError(
                f"{cfg.pretrained_path}: tokenizer has {len(tokenizer)} tokens but the model embeds only {n_emb}"
            )
        return model
    raise ValueError(f"unknown model.init {cfg.init!r} (expected tiny | pretrained)")


def _dropout_config_fields(config) -> list[tuple[Any, str]]:
    """(config object, field) pairs of float dropout probabilities, sub-configs included."""
    out: list[tuple[Any, str]] = []
    seen: set[int] = set()

    def visit(c) -> None:
        if c is None or id(c) in seen:
            return
        seen.add(id(c))
        for key, val in vars(c).items():
            if isinstance(val, (float, int)) and not isinstance(val, bool) and (
                "dropout" in key or key.endswith("_pdrop") or key == "pdrop"
            ):
                out.append((c, key))
            elif hasattr(val, "to_dict") and hasattr(val, "model_type"):
                visit(val)

    visit(config)
    return out


def disable_dropout(model: nn.Module) -> nn.Module:
    """Set every dropout probability to 0: ``nn.Dropout*`` modules, modules' float ``*dropout*``
    attributes (e.g. ``Qwen3Attention.attention_dropout``) and the config's dropout fields."""
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for key, val in list(vars(module).items()):
            if "dropout" in key and isinstance(val, float):
                setattr(module, key, 0.0)
    config = getattr(model, "config", None)
    if config is not None:
        for c, key in _dropout_config_fields(config):
            setattr(c, key, 0.0)
    return model


def assert_no_dropout(model: nn.Module) -> None:
    """Raise :class:`DropoutActiveError` if any dropout probability (module or config) is > 0.

    Checked regardless of train/eval mode: RL and teacher scoring call ``model.train()``.
    """
    active: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            active.append(f"{name or '<root>'} ({type(module).__name__} p={module.p})")
        for key, val in vars(module).items():
            if "dropout" in key and isinstance(val, float) and val > 0:
                active.append(f"{name or '<root>'}.{key}={val}")
    config = getattr(model, "config", None)
    if config is not None:
        for c, key in _dropout_config_fields(config):
            if getattr(c, key) > 0:
                active.append(f"config.{key}={getattr(c, key)}")
    if active:
        shown = "; ".join(active[:8]) + (f"; … ({len(active)} in all)" if len(active) > 8 else "")
        raise DropoutActiveError(f"dropout is active: {shown}")


def save_hf(model, tokenizer, out_dir: str | Path) -> Path:
    """Write ``model`` (safetensors + config + generation config) and ``tokenizer`` to ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    if not (out / "model.safetensors").is_file() and not (out / "model.safetensors.index.json").is_file():
        raise ModelLoadError(f"{out}: save_pretrained wrote no safetensors weights")
    return out
