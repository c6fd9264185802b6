"""Generation backends: prompts in, :class:`Generation` records out.

All backends share one contract (:class:`GenerationBackend`):

- ``generate(prompts, params)`` takes chat prompts (lists of ``{"role", "content"}``
  messages); local backends render them with the tokenizer's chat template and
  ``add_generation_prompt=True``.
- ``generate_ids(prompt_ids, params)`` takes already tokenised prompts.
- One :class:`Generation` per prompt, in order. Failures are data: a prompt that could not
  be generated gets ``finish_reason="error"`` and ``error`` set, never an exception that
  kills the batch and never an empty "success".

**Log-prob convention.** ``Generation.logprobs[t]`` is ``log softmax(logits_t)[token_t]``
computed from the model's raw logits at temperature 1, without top-p truncation — i.e. the
log-probability of the token under the *policy* ``pi_theta`` itself, not under the
temperature-scaled / truncated sampling distribution. This is the quantity the trainer
recomputes with a teacher-forced forward pass (PPO ``old_logp``, importance ratios), so the
two agree up to numerics (tested to 1e-4), and it is what vLLM returns by default
(``logprobs_mode="raw_logprobs"``). With ``temperature=1`` and ``top_p=1`` it is exactly the
sampling log-prob.

**Stop tokens.** ``SamplingParams.stop_token_ids=None`` means "the tokenizer's eos"
(``<|im_end|>`` for the project tokenizer); ``[]`` disables stopping. A produced stop token
is kept in ``token_ids``/``logprobs``/``text`` and gives ``finish_reason="stop"``; reaching
``max_new_tokens`` first gives ``"length"``.
"""
from __future__ import annotations

import inspect
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, Protocol, Sequence, runtime_checkable

import torch

__all__ = [
    "BackendUnavailable",
    "SamplingParams",
    "Generation",
    "GenerationBackend",
    "TransformersBackend",
    "OpenAIBackend",
    "VLLMBackend",
    "make_backend",
    "colocated_backend",
    "sampling_body",
]

FinishReason = Literal["stop", "length", "error"]


class BackendUnavailable(RuntimeError):
    """A backend whose runtime requirements (package, device) are missing."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature == 0`` means greedy (``top_p``/``seed`` unused)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    #: decode under the ``<think>reasoning</think>utterance`` grammar (:mod:`mimesis_lab.rollout.think_guide`)
    think_format: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Generation:
    """One prompt's generation.

    ``token_ids`` are the generated ids (prompt excluded, stop token included if produced);
    ``logprobs`` has one entry per generated token (see the module docstring for the
    convention). ``text`` is the decoded generation with special tokens kept. Remote
    backends may not know token ids (``token_ids == []``, see :class:`OpenAIBackend`).
    """

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    error: str | None = None
    transient: bool = False        # a remote failure whose retries ran out on a timeout / transport / 429 / 5xx
    recovered_retries: int = 0     # failed remote attempts before this generation
    guided: int = 0                # think_format: steps where the grammar masked the model's most likely token
    forced_close: bool = False     # think_format: the think block was closed for lack of room

    @property
    def ok(self) -> bool:
        return self.finish_reason != "error"

    @classmethod
    def failed(cls, error: str, prompt_ids: list[int] | None = None, transient: bool = False) -> "Generation":
        return cls(prompt_ids=list(prompt_ids or []), token_ids=[], logprobs=[], text="",
                   finish_reason="error", error=error, transient=transient)


def _finish(reason: Any) -> FinishReason:
    """An OpenAI ``finish_reason`` as ours: ``length`` stays, anything else is ``stop``."""
    return "length" if reason == "length" else "stop"


@runtime_checkable
class GenerationBackend(Protocol):
    def generate(self, prompts: list[list[dict]], params: SamplingParams) -> list[Generation]: ...

    def generate_ids(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[Generation]: ...


def _render_chat(tokenizer, messages: list[dict]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys") and "input_ids" in ids:  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def _stop_ids(params: SamplingParams, tokenizer) -> set[int]:
    if params.stop_token_ids is not None:
        return {int(t) for t in params.stop_token_ids}
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(t) for t in (eos if isinstance(eos, (list, tuple)) else [eos])}


# ----------------------------------------------------------------------------- transformers


def _cache_of(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _growing_layer_class():
    """A ``DynamicLayer`` that appends into a preallocated buffer instead of ``torch.cat``-ing the
    whole cache every step (the per-step copy grows with batch x context and dominated batched
    decoding on CPU). ``None`` when this transformers has no ``DynamicLayer``."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # pragma: no cover - older transformers: keep the library's cache
        return None

    class GrowingLayer(DynamicLayer):
        _kbuf = _vbuf = _view = None
        target = 0       # the length reserved for (a rebuilt buffer gets it again, not twice the need)

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n, add = self.get_seq_length(), key_states.shape[-2]
            kb = self._kbuf
            # the buffer is stale when someone replaced ``keys`` (batch_select_indices, crop, reset)
            if (kb is None or self.keys is not self._view or kb.shape[0] != key_states.shape[0]
                    or n + add > kb.shape[-2]):
                self._reserve(max(n + add, self.target), grow=n + add > self.target)
            self._kbuf[..., n:n + add, :] = key_states
            self._vbuf[..., n:n + add, :] = value_states
            self.keys = self._view = self._kbuf[..., : n + add, :]
            self.values = self._vbuf[..., : n + add, :]
            return self.keys, self.values

        def _reserve(self, length: int, grow: bool = False) -> None:
            n = self.get_seq_length()
            ref_k, ref_v = self.keys, self.values
            cap = max(length, 2 * length if grow else length, 16)
            kb = ref_k.new_empty((*ref_k.shape[:-2], cap, ref_k.shape[-1]))
            vb = ref_v.new_empty((*ref_v.shape[:-2], cap, ref_v.shape[-1]))
            if n:
                kb[..., :n, :] = ref_k
                vb[..., :n, :] = ref_v
            self._kbuf, self._vbuf = kb, vb
            self.keys = self._view = kb[..., :n, :]
            self.values = vb[..., :n, :]

    return GrowingLayer


_GROWING_LAYER = _growing_layer_class()


def _reserve_cache(past, length: int) -> None:
    """Make the (DynamicCache) ``past`` append in place up to ``length`` tokens per row; a cache of
    another kind is left alone."""
    layers = getattr(past, "layers", None)
    if _GROWING_LAYER is None or not isinstance(layers, list):
        return
    base = _GROWING_LAYER.__mro__[1]
    for i, lay in enumerate(layers):
        if type(lay) is not base or not getattr(lay, "is_initialized", False) or lay.get_seq_length() == 0:
            continue
        grown = _GROWING_LAYER()
        grown.__dict__.update(lay.__dict__)
        grown.target = length
        grown._reserve(length)
        layers[i] = grown


class TransformersBackend:
    """In-process generation with a Hugging Face causal LM.

    Own decoding loop: prompts are left-padded into batches of ``batch_size``, the prompt is
    prefilled once and every step feeds one token through the KV cache with explicit
    ``position_ids`` (so padding does not shift positions: a batched greedy generation gives
    the same ids as each prompt alone — tested). Sampling uses one ``torch.Generator`` per
    prompt seeded with ``seed + index`` (index within the call), so results do not depend on
    ``batch_size``. ``seed=None`` draws from the global torch RNG.

    ``seeds`` (``generate``/``generate_ids``, optional, one per prompt) overrides ``seed + index``
    with each prompt's own seed: a server that batches independent requests passes each request's
    seed, so a request samples the same tokens whichever requests share its call (up to the
    floating-point noise of padding; tested). A ``None`` entry in ``seeds`` gets a seed drawn
    from the global torch RNG.
    """

    def __init__(self, model, tokenizer, batch_size: int = 8, prefix_cache_tokens: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if prefix_cache_tokens < 0:
            raise ValueError(f"prefix_cache_tokens must be >= 0, got {prefix_cache_tokens}")
        self.prefix_cache = _KVStore(prefix_cache_tokens) if prefix_cache_tokens else None
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self._think_tokens = None      # the think_format grammar's token sets, built on first use
        pad = getattr(tokenizer, "pad_token_id", None)
        if pad is None:
            pad = getattr(getattr(model, "config", None), "pad_token_id", None)
        self.pad_token_id = int(pad if pad is not None else 0)
        try:
            self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        except (TypeError, ValueError):  # pragma: no cover
            self._keeps_logits = False

    # -- weights
    def update_weights(self, state_dict: dict[str, torch.Tensor] | torch.nn.Module) -> None:
        """Copy the policy's weights into the generation model (strict: every key must match)."""
        if isinstance(state_dict, torch.nn.Module):
            state_dict = state_dict.state_dict()
        self.model.load_state_dict(state_dict, strict=True)
        self.reset_prefix_cache()

    def reset_prefix_cache(self) -> None:
        """Forget cached KV (must be called whenever the weights change; rollouts call it per batch)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    # -- API
    def generate(self, prompts: list[list[dict]], params: SamplingParams,
                 seeds: Sequence[int | None] | None = None) -> list[Generation]:
        rendered: list[list[int] | Generation] = []
        for messages in prompts:
            try:
                rendered.append(_render_chat(self.tokenizer, messages))
            except Exception as e:  # a bad prompt is data, not a crash of the batch
                rendered.append(Generation.failed(f"chat template failed: {type(e).__name__}: {e}"))
        keep = [k for k, r in enumerate(rendered) if not isinstance(r, Generation)]
        ids = [rendered[k] for k in keep]
        gens = iter(self.generate_ids(ids, params, None if seeds is None else [seeds[k] for k in keep]))
        return [r if isinstance(r, Generation) else next(gens) for r in rendered]

    def generate_ids(self, prompt_ids: list[list[int]], params: SamplingParams,
                     seeds: Sequence[int | None] | None = None) -> list[Generation]:
        if seeds is not None and len(seeds) != len(prompt_ids):
            raise ValueError(f"seeds has {len(seeds)} entries for {len(prompt_ids)} prompts")
        out: list[Generation | None] = [None] * len(prompt_ids)
        todo = []
        for i, p in enumerate(prompt_ids):
            if len(p) == 0:
                out[i] = Generation.failed("empty prompt")
            else:
                todo.append(i)
        stop = _stop_ids(params, self.tokenizer)
        was_training = self.model.training
        self.model.eval()
        try:
            # similar lengths share a batch (less left padding); results go back by index and the
            # per-prompt seeds use the original index, so the order does not change any output
            todo.sort(key=lambda i: (len(prompt_ids[i]), tuple(prompt_ids[i])))   # duplicates adjacent
            for start in range(0, len(todo), self.batch_size):
                idx = todo[start:start + self.batch_size]
                batch = [[int(t) for t in prompt_ids[i]] for i in idx]
                try:
                    results = self._generate_batch(batch, self._row_seeds(idx, params, seeds), params, stop)
                except (RuntimeError, ValueError, IndexError) as e:
                    results = [Generation.failed(f"{type(e).__name__}: {e}", b) for b in batch]
                for i, g in zip(idx, results):
                    out[i] = g
        finally:
            self.model.train(was_training)
        return out  # type: ignore[return-value]

    # -- internals
    @staticmethod
    def _row_seeds(idx: list[int], params: SamplingParams,
                   seeds: Sequence[int | None] | None) -> list[int] | None:
        """Each row's sampling seed (``None``: unseeded rows, drawn with the global RNG)."""
        if params.temperature == 0:
            return None
        if seeds is None:
            return None if params.seed is None else [int(params.seed) + i for i in idx]
        row = [seeds[i] for i in idx]
        if all(s is None for s in row):
            return None
        return [int(s) if s is not None else int(torch.randint(0, 2**62, (1,)).item()) for s in row]

    @torch.inference_mode()
    def _generate_batch(self, batch: list[list[int]], row_seeds: list[int] | None, params: SamplingParams,
                        stop: set[int]) -> list[Generation]:
        device = next(self.model.parameters()).device
        n, width = len(batch), max(len(b) for b in batch)
        # shared-prompt prefill: identical prompts (a GRPO group's first turn) are prefilled once and
        # their KV cache rows copied, as prefix caching does in vLLM
        first: dict[tuple[int, ...], int] = {}
        src = [first.setdefault(tuple(b), len(first)) for b in batch]
        uniq = [list(k) for k in first]
        from transformers import DynamicCache

        if not hasattr(DynamicCache, "batch_select_indices"):
            uniq, src = batch, list(range(n))
        m = len(uniq)
        cached = [(0, None)] * m
        if self.prefix_cache is not None:
            # reuse at most len - 1 tokens: the last prompt token must be fed to get the next logits
            cached = [(min(c, len(b) - 1), kv) if kv is not None else (0, None)
                      for b, (c, kv) in zip(uniq, (self.prefix_cache.longest(b) for b in uniq))]
            cached = [(c, kv) if c >= _KVStore.MIN_REUSE else (0, None) for c, kv in cached]
            self.prefix_cache.hits += sum(c > 0 for c, _ in cached)
            self.prefix_cache.reused_tokens += sum(c for c, _ in cached)
        cached = self._bucket_prefill(uniq, cached, device)
        wc = max(c for c, _ in cached)
        suffixes = [b[c:] for b, (c, _) in zip(uniq, cached)]
        ws = max(len(x) for x in suffixes)
        input_ids = torch.full((m, ws), self.pad_token_id, dtype=torch.long, device=device)
        attn_s = torch.zeros((m, ws), dtype=torch.long, device=device)
        for r, x in enumerate(suffixes):
            input_ids[r, ws - len(x):] = torch.tensor(x, dtype=torch.long, device=device)
            attn_s[r, ws - len(x):] = 1
        start = torch.tensor([c for c, _ in cached], dtype=torch.long, device=device).unsqueeze(1)
        pos = (attn_s.cumsum(-1) - 1).clamp(min=0) + start
        prefix_kw: dict[str, Any] = {}
        if wc:
            from transformers import DynamicCache

            n_layers = len(next(kv for c, kv in cached if kv is not None))
            ref_k = next(kv for c, kv in cached if kv is not None)[0][0]
            layers = []
            for li in range(n_layers):
                k = torch.zeros((m, ref_k.shape[0], wc, ref_k.shape[2]), dtype=ref_k.dtype, device=device)
                v = torch.zeros_like(k)
                for r, (c, kv) in enumerate(cached):
                    if c:
                        k[r, :, wc - c:, :] = kv[li][0][:, :c, :]
                        v[r, :, wc - c:, :] = kv[li][1][:, :c, :]
                layers.append((k, v))
            attn_c = torch.zeros((m, wc), dtype=torch.long, device=device)
            for r, (c, _) in enumerate(cached):
                if c:
                    attn_c[r, wc - c:] = 1
            prefix_kw = {"past": DynamicCache(ddp_cache_data=layers)}
            attn = torch.cat([attn_c, attn_s], dim=1)
        else:
            attn = attn_s
        gens = None
        if row_seeds is not None:
            gens = []
            for seed in row_seeds:
                g = torch.Generator(device=device)
                g.manual_seed(seed)
                gens.append(g)

        tokens: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        done = [False] * n
        finish: list[FinishReason] = ["length"] * n
        # transformers >= 5.2x names the KV cache ``cache`` (``past_key_values`` is deprecated)
        cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        # logits only for the last position: the prompt's other logits are never used (and the
        # [batch, prompt, vocab] projection would dominate the prefill)
        keep = {"logits_to_keep": 1} if self._keeps_logits else {}
        if prefix_kw:
            out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=True,
                             **{cache_kw: prefix_kw["past"]}, **keep)
        else:
            out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=True, **keep)
        past = _cache_of(out)
        logits = out.logits[:, -1, :].float()
        next_pos = pos[:, -1:] + 1
        if m < n:
            expand = torch.tensor(src, dtype=torch.long, device=device)
            past.batch_select_indices(expand)
            logits, attn, next_pos = logits[expand], attn[expand], next_pos[expand]
        if params.max_new_tokens > 1:
            _reserve_cache(past, attn.shape[1] + params.max_new_tokens)
        alive = list(range(n))       # rows still generating; tensors below hold only these rows
        prunable = hasattr(past, "batch_select_indices")
        guide = None
        if params.think_format:
            from mimesis_lab.rollout.think_guide import ThinkGuide, think_tokens

            if self._think_tokens is None:
                self._think_tokens = think_tokens(self.tokenizer)     # once per backend (decodes the vocabulary)
            guide = ThinkGuide(self._think_tokens, n, params.max_new_tokens, frozenset(stop))
        for step in range(params.max_new_tokens):
            if guide is not None:
                guide.mask(logits, alive, step)
            logp = torch.log_softmax(logits, dim=-1)
            nxt = self._choose(logits, params, gens).tolist()
            picked = logp.gather(-1, torch.tensor(nxt, device=logp.device).unsqueeze(-1)).squeeze(-1).tolist()
            for j, r in enumerate(alive):
                if done[r]:
                    continue
                tokens[r].append(nxt[j])
                logps[r].append(picked[j])
                if guide is not None:
                    guide.advance(r, nxt[j])
                if nxt[j] in stop:
                    done[r], finish[r] = True, "stop"
            if all(done) or step == params.max_new_tokens - 1:
                break
            if prunable and any(done[r] for r in alive):
                # finished rows leave the batch (KV cache rows included): no compute on padding tails
                self._store_rows(past, attn, alive, [j for j, r in enumerate(alive) if done[r]], batch, tokens)
                keep_rows = [j for j, r in enumerate(alive) if not done[r]]
                sel = torch.tensor(keep_rows, dtype=torch.long, device=device)
                past.batch_select_indices(sel)
                attn, next_pos = attn[sel], next_pos[sel]
                alive = [alive[j] for j in keep_rows]
                gens = [gens[j] for j in keep_rows] if gens is not None else None
            feed = torch.tensor([self.pad_token_id if done[r] else tokens[r][-1] for r in alive],
                                dtype=torch.long, device=device).unsqueeze(1)
            attn = torch.cat([attn, torch.ones((len(alive), 1), dtype=torch.long, device=device)], dim=1)
            out = self.model(input_ids=feed, attention_mask=attn, position_ids=next_pos,
                             use_cache=True, **{cache_kw: past}, **keep)
            past = _cache_of(out)
            logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1

        if prunable:
            self._store_rows(past, attn, alive, list(range(len(alive))), batch, tokens)
        results = []
        for r in range(n):
            text = self.tokenizer.decode(tokens[r], skip_special_tokens=False)
            results.append(Generation(prompt_ids=batch[r], token_ids=tokens[r], logprobs=logps[r],
                                      text=text, finish_reason=finish[r],
                                      guided=guide.guided[r] if guide else 0,
                                      forced_close=guide.forced_close[r] if guide else False))
        return results

    def _store_rows(self, past, attn: torch.Tensor, alive: list[int], rows: list[int], batch: list[list[int]],
                    tokens: list[list[int]]) -> None:
        """Save the KV of ``rows`` (indices into ``alive``) as ``prompt + fed tokens`` in the prefix cache."""
        if self.prefix_cache is None or not rows:
            return
        layers = getattr(past, "layers", None)
        if not layers or attn.shape[1] != layers[0].keys.shape[-2]:
            return
        for j in rows:
            r = alive[j]
            cols = attn[j].nonzero().squeeze(-1)
            seq = tuple(batch[r]) + tuple(tokens[r][:-1])
            if len(cols) != len(seq):
                continue   # defensive: never store KV that does not line up with its tokens
            kv = [(lay.keys[j][:, cols, :].clone(), lay.values[j][:, cols, :].clone()) for lay in layers]
            self.prefix_cache.put(seq, kv)

    def _bucket_prefill(self, uniq: list[list[int]], cached: list[tuple[int, Any]], device) -> list[tuple[int, Any]]:
        """Prefill prompts of very different lengths in buckets of similar length.

        One left-padded forward over all prompts computes the padding too (and its attention is
        masked, so the fast causal kernels do not apply): with a few long and many short prompts
        most of that work is padding. Rows without a cached prefix are sorted by length and split
        into contiguous buckets minimising ``sum(overhead + rows * longest)`` (``overhead``: the cost
        of one more forward in tokens, 64 on CPU, 2048 on an accelerator); each bucket is prefilled
        up to its prompts' last token, and the batch continues from those caches as from cached
        prefixes (the last prompt token is fed with the batch). With one bucket nothing changes."""
        todo = [r for r, (c, _) in enumerate(cached) if c == 0 and len(uniq[r]) >= 2]
        if len(todo) < 2:
            return cached
        todo.sort(key=lambda r: len(uniq[r]))
        lens = [len(uniq[r]) - 1 for r in todo]
        buckets = _buckets(lens, 64 if device.type == "cpu" else 2048)
        if len(buckets) < 2:
            return cached
        keep = {"logits_to_keep": 1} if self._keeps_logits else {}
        out_cached = list(cached)
        for lo, hi in buckets:
            rows, w = todo[lo:hi], lens[hi - 1]
            ids = torch.full((len(rows), w), self.pad_token_id, dtype=torch.long, device=device)
            attn = torch.zeros((len(rows), w), dtype=torch.long, device=device)
            for j, r in enumerate(rows):
                L = len(uniq[r]) - 1
                ids[j, w - L:] = torch.tensor(uniq[r][:-1], dtype=torch.long, device=device)
                attn[j, w - L:] = 1
            pos = (attn.cumsum(-1) - 1).clamp(min=0)
            out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, **keep)
            layers = getattr(_cache_of(out), "layers", None)
            if not layers or not hasattr(layers[0], "keys"):
                return cached          # a cache this code cannot read: one padded prefill, as before
            for j, r in enumerate(rows):
                L = len(uniq[r]) - 1
                out_cached[r] = (L, [(lay.keys[j][:, w - L:, :], lay.values[j][:, w - L:, :]) for lay in layers])
        return out_cached

    @staticmethod
    def _choose(logits: torch.Tensor, params: SamplingParams, gens) -> torch.Tensor:
        if params.temperature == 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sp, si = probs.sort(dim=-1, descending=True)
            cum = sp.cumsum(dim=-1)
            drop = (cum - sp) >= params.top_p  # keep the smallest prefix whose mass reaches top_p
            sp = sp.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, si, sp)
            probs = probs / probs.sum(dim=-1, keepdim=True)
        if gens is None:
            return torch.multinomial(probs, 1).squeeze(-1)
        # inverse-CDF sampling, one uniform per row from the row's own generator: the draw of a row
        # does not depend on the other rows (batch-invariant) and the vocabulary-sized work is
        # batched (multinomial with a generator per row was the sampling bottleneck)
        u = torch.cat([torch.rand(1, generator=g, device=probs.device, dtype=torch.float64) for g in gens])
        cdf = probs.double().cumsum(dim=-1)
        idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).squeeze(-1)
        return idx.clamp_(max=probs.shape[-1] - 1)


def _buckets(lengths: list[int], overhead: int) -> list[tuple[int, int]]:
    """Split ascending ``lengths`` into contiguous ``[lo, hi)`` buckets minimising
    ``sum(overhead + (hi - lo) * lengths[hi - 1])`` (padded tokens plus a per-forward cost)."""
    n = len(lengths)
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            c = best[i] + overhead + (j - i) * lengths[j - 1]
            if c < best[j]:
                best[j], cut[j] = c, i
    out, j = [], n
    while j > 0:
        out.append((cut[j], j))
        j = cut[j]
    return out[::-1]


class _KVStore:
    """Cross-call prefix cache: KV tensors of finished sequences, reused by later prompts that
    start with them (a multi-turn episode's next prompt extends its previous prompt + reply).

    Entries are ``token tuple -> [(k, v) per layer]`` with ``k, v: [kv_heads, L, head_dim]``;
    least recently used entries are dropped beyond ``max_tokens`` cached tokens. Only valid for
    one set of weights: :meth:`TransformersBackend.reset_prefix_cache` clears it.
    """

    MIN_REUSE = 16   # shorter shared prefixes are not worth the bookkeeping

    def __init__(self, max_tokens: int):
        from collections import OrderedDict

        self.max_tokens = max_tokens
        self.entries: "OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]]" = OrderedDict()
        self.tokens = 0
        self.hits = 0
        self.reused_tokens = 0

    def clear(self) -> None:
        self.entries.clear()
        self.tokens = 0

    def put(self, seq: tuple[int, ...], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if len(seq) < self.MIN_REUSE or len(seq) > self.max_tokens:
            return
        if seq in self.entries:
            self.entries.move_to_end(seq)
            return
        self.entries[seq] = kv
        self.tokens += len(seq)
        while self.tokens > self.max_tokens and self.entries:
            old, _ = self.entries.popitem(last=False)
            self.tokens -= len(old)

    def longest(self, prompt: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """Longest common prefix with a stored sequence: ``(length, kv)`` (``(0, None)`` if none is useful)."""
        import numpy as np

        best, best_kv, best_key = 0, None, None
        p = np.asarray(prompt, dtype=np.int64)
        for key, kv in self.entries.items():
            m = min(len(key), len(p))
            if m <= best:
                continue
            diff = np.flatnonzero(np.asarray(key[:m], dtype=np.int64) != p[:m])
            lcp = int(diff[0]) if diff.size else m
            if lcp > best:
                best, best_kv, best_key = lcp, kv, key
        if best < self.MIN_REUSE:
            return 0, None
        self.entries.move_to_end(best_key)
        return best, best_kv


# ----------------------------------------------------------------------------- OpenAI-compatible


def sampling_body(model: str, params: SamplingParams) -> dict[str, Any]:
    """The OpenAI request fields of ``params``: model, max_tokens, temperature, top_p, seed (if set) and
    vLLM's ``stop_token_ids`` (if set; other servers ignore it)."""
    body: dict[str, Any] = {"model": model, "max_tokens": params.max_new_tokens,
                            "temperature": params.temperature, "top_p": params.top_p}
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    if params.think_format:
        body["think_format"] = True
    return body


class OpenAIBackend:
    """An OpenAI-compatible server (``vllm serve``, OpenAI, …).

    ``generate`` POSTs ``{base_url}/chat/completions`` with ``logprobs: true`` (one request per
    prompt, up to ``max_concurrency`` in flight). ``generate_ids`` POSTs
    ``{base_url}/completions`` with the token-id list as ``prompt`` (supported by OpenAI and
    vLLM) and ``logprobs: 0``.

    Token ids: chat servers return token *strings*, not ids, so ``token_ids`` is ``[]`` unless
    every returned token has vLLM's ``"token_id:<n>"`` form (``return_tokens_as_token_ids``);
    ``logprobs`` are filled when the server provides them, else ``[]``. ``prompt_ids`` is
    ``[]`` for chat prompts (the server renders the template).

    Every request goes through the shared retry loop (:meth:`mimesis_lab.endpoint.ChatEndpoint.call`,
    exponential backoff ``backoff_s * 2 ** (k - 1)`` before retry ``k``): transport errors, timeouts,
    HTTP 429/5xx, malformed bodies and missing or empty content are retried up to ``max_retries``
    times; other HTTP 4xx and refusals are final at once. A request that still fails becomes
    ``Generation(finish_reason="error", error=..., transient=...)``; ``recovered_retries`` counts the
    failed tries before a generation. The API key is read from ``api_key_env`` if set (local servers
    need none).
    """

    def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY",
                 timeout_s: float = 60, max_retries: int = 2, backoff_s: float = 0.5,
                 max_concurrency: int = 8, client=None):
        from mimesis_lab.config import OpenAIEndpoint
        from mimesis_lab.endpoint import ChatEndpoint

        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_concurrency = max(1, max_concurrency)
        endpoint = OpenAIEndpoint(base_url=self.base_url, model=model, api_key_env=api_key_env or "",
                                  timeout_s=float(timeout_s), max_retries=max_retries)
        self.chat = ChatEndpoint(endpoint, client, backoff_s=backoff_s, backoff="exponential")

    def close(self) -> None:
        self.chat.close()

    @staticmethod
    def _token_ids(tokens: list[Any]) -> list[int]:
        ids = []
        for t in tokens:
            if not (isinstance(t, str) and t.startswith("token_id:") and t[9:].lstrip("-").isdigit()):
                return []
            ids.append(int(t[9:]))
        return ids

    def _parse_chat(self, payload: dict[str, Any]) -> Generation:
        from mimesis_lab.endpoint import AnswerError, chat_message

        content = chat_message(payload).get("content")
        if not isinstance(content, str) or not content:
            raise AnswerError("response has no message content")
        choice = payload["choices"][0]
        entries = ((choice.get("logprobs") or {}).get("content")) or []
        logprobs = [float(e["logprob"]) for e in entries]
        ids = self._token_ids([e.get("token") for e in entries])
        return Generation(prompt_ids=[], token_ids=ids, logprobs=logprobs, text=content,
                          finish_reason=_finish(choice.get("finish_reason")))

    def _parse_completion(self, ids: list[int]):
        from mimesis_lab.endpoint import AnswerError, MalformedResponse

        def parse(payload: dict[str, Any]) -> Generation:
            choices = payload.get("choices")
            if not isinstance(choices, list) or not choices:
                raise MalformedResponse("response has no choices")
            choice = choices[0]
            text = choice.get("text")
            if not isinstance(text, str) or not text:
                raise AnswerError("response has no text")
            lp = choice.get("logprobs") or {}
            logprobs = [float(x) for x in (lp.get("token_logprobs") or []) if x is not None]
            tok_ids = self._token_ids(lp.get("tokens") or [])
            return Generation(prompt_ids=list(ids), token_ids=tok_ids, logprobs=logprobs, text=text,
                              finish_reason=_finish(choice.get("finish_reason")))

        return parse

    def _result(self, res, prompt_ids: list[int] | None = None) -> Generation:
        if not res.ok:
            return Generation.failed(res.failure.detail, prompt_ids, transient=res.failure.transient)
        res.value.recovered_retries = res.recovered_retries
        return res.value

    def _chat_one(self, messages: list[dict], params: SamplingParams) -> Generation:
        body = sampling_body(self.model, params) | {"messages": messages, "logprobs": True}
        return self._result(self.chat.call(body, self._parse_chat))

    def _completion_one(self, ids: list[int], params: SamplingParams) -> Generation:
        body = sampling_body(self.model, params) | {"prompt": list(ids), "logprobs": 0}
        return self._result(self.chat.call(body, self._parse_completion(ids), path="/completions"), ids)

    def _map(self, fn, items, params) -> list[Generation]:
        if len(items) <= 1 or self.max_concurrency == 1:
            return [fn(x, params) for x in items]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(items))) as pool:
            return list(pool.map(lambda x: fn(x, params), items))

    def generate(self, prompts: list[list[dict]], params: SamplingParams) -> list[Generation]:
        return self._map(self._chat_one, prompts, params)

    def generate_ids(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[Generation]:
        return self._map(self._completion_one, prompt_ids, params)


# ----------------------------------------------------------------------------- vLLM


class VLLMBackend:
    """In-process vLLM (paper profile). ``vllm`` is imported here, never at module import.

    Raises :class:`BackendUnavailable` when vllm is not installed or CUDA is unavailable.
    Log-probs are vLLM's sampled-token log-probs (``logprobs=0``), which vLLM computes from
    the raw logits by default — the same convention as :class:`TransformersBackend`.
    """

    def __init__(self, model_path: str, tokenizer=None, gpu_memory_utilization: float = 0.5,
                 dtype: str = "auto", seed: int = 0, **llm_kwargs):
        try:
            import vllm  # noqa: F401
        except Exception as e:  # ImportError, or a broken install
            raise BackendUnavailable(
                f"the vllm backend needs the 'vllm' package (pip install '.[gpu]'): {type(e).__name__}: {e}"
            ) from e
        if not torch.cuda.is_available():
            raise BackendUnavailable("the vllm backend needs a CUDA device; none is available "
                                     "(use the transformers backend on CPU)")
        self._vllm = vllm
        self.llm = vllm.LLM(model=str(model_path), dtype=dtype, seed=seed,
                            gpu_memory_utilization=gpu_memory_utilization, **llm_kwargs)
        self.tokenizer = tokenizer if tokenizer is not None else self.llm.get_tokenizer()

    def _sampling(self, params: SamplingParams):
        if params.think_format:
            raise ValueError("think_format is a grammar of the transformers backend (mimesis_lab.rollout.serve); "
                             "a vLLM server constrains the format with its own structured outputs")
        return self._vllm.SamplingParams(
            max_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
            seed=params.seed, stop_token_ids=sorted(_stop_ids(params, self.tokenizer)),
            logprobs=0, skip_special_tokens=False, ignore_eos=params.stop_token_ids is not None,
        )

    def update_weights(self, state_dict: dict[str, torch.Tensor] | torch.nn.Module) -> None:
        """Load the policy's weights into the running engine (single-process engine only)."""
        if isinstance(state_dict, torch.nn.Module):
            state_dict = state_dict.state_dict()
        weights = list(state_dict.items())
        self.llm.apply_model(lambda m: m.load_weights(weights))
        try:
            self.llm.reset_prefix_cache()
        except Exception:  # older vllm
            pass

    def generate(self, prompts: list[list[dict]], params: SamplingParams) -> list[Generation]:
        rendered: list[list[int] | Generation] = []
        for messages in prompts:
            try:
                rendered.append(_render_chat(self.tokenizer, messages))
            except Exception as e:
                rendered.append(Generation.failed(f"chat template failed: {type(e).__name__}: {e}"))
        ids = [r for r in rendered if not isinstance(r, Generation)]
        gens = iter(self.generate_ids(ids, params))
        return [r if isinstance(r, Generation) else next(gens) for r in rendered]

    def generate_ids(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[Generation]:
        if not prompt_ids:
            return []
        prompts = [{"prompt_token_ids": [int(t) for t in p]} for p in prompt_ids]
        try:
            outs = self.llm.generate(prompts, self._sampling(params), use_tqdm=False)
        except Exception as e:
            return [Generation.failed(f"{type(e).__name__}: {e}", p) for p in prompt_ids]
        res = []
        for p, o in zip(prompt_ids, outs):
            c = o.outputs[0]
            ids = [int(t) for t in c.token_ids]
            lps = [float(d[t].logprob) for t, d in zip(ids, c.logprobs or [])] if c.logprobs else []
            res.append(Generation(prompt_ids=list(p), token_ids=ids, logprobs=lps,
                                  text=self.tokenizer.decode(ids, skip_special_tokens=False),
                                  finish_reason="length" if c.finish_reason == "length" else "stop"))
        return res


# ----------------------------------------------------------------------------- factory


_BACKENDS = {"transformers": TransformersBackend, "openai": OpenAIBackend, "vllm": VLLMBackend}


def make_backend(kind: str, **kw) -> GenerationBackend:
    """Build a backend by name: ``transformers`` | ``openai`` | ``vllm`` (kwargs go to its ``__init__``)."""
    try:
        cls = _BACKENDS[kind]
    except KeyError:
        raise ValueError(f"unknown generation backend {kind!r}; choose one of {sorted(_BACKENDS)}") from None
    return cls(**kw)


def colocated_backend(rollout_cfg: Any, init_from: str, module: Any, tokenizer: Any):
    """The rollout engine of an RL job: the ``transformers`` backend reads the trained module's weights
    in place (colocated); ``vllm`` starts an engine from ``init_from`` whose weights the job refreshes
    before every step."""
    if rollout_cfg.backend == "vllm":
        return VLLMBackend(init_from, tokenizer=tokenizer, gpu_memory_utilization=rollout_cfg.gpu_memory_utilization)
    return TransformersBackend(module, tokenizer, batch_size=rollout_cfg.batch_size,
                               prefix_cache_tokens=rollout_cfg.prefix_cache_tokens)
