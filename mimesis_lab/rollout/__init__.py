"""Rollout generation for simulator RL (SPEC.md §2.3, DESIGN.md §3).

:mod:`mimesis_lab.rollout.backends` turns chat prompts (or token-id prompts) into
:class:`~mimesis_lab.rollout.backends.Generation` records — generated token ids, their
log-probs under the sampling policy, the decoded text and a ``finish_reason`` — through one
of three interchangeable backends:

- ``transformers``: the in-process policy (tiny profile, CPU), batched with left padding
  and the KV cache; its weights are refreshed from the trainer with ``update_weights``.
- ``openai``: any OpenAI-compatible ``/chat/completions`` server (e.g. ``vllm serve``);
  failed requests become ``finish_reason="error"`` records, never exceptions.
- ``vllm``: in-process vLLM (paper profile, GPU); imported lazily, so the project runs
  without it.

Use :func:`~mimesis_lab.rollout.backends.make_backend` to build one by name.
"""
from mimesis_lab.rollout.backends import (
    BackendUnavailable,
    Generation,
    GenerationBackend,
    OpenAIBackend,
    SamplingParams,
    TransformersBackend,
    VLLMBackend,
    make_backend,
)

__all__ = [
    "BackendUnavailable",
    "Generation",
    "GenerationBackend",
    "OpenAIBackend",
    "SamplingParams",
    "TransformersBackend",
    "VLLMBackend",
    "make_backend",
]
