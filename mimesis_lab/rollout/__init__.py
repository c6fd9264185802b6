"""Rollouts: generation backends, simulator and agent episodes, and the user side over HTTP (SPEC §2.3, §3.1).

- :mod:`.backends` — generation backends (below).
- :mod:`.sim_rollout` — batched simulator episodes over many tasks (simulator RL, ``sim_eval``).
- :mod:`.agent_rollout` — multi-turn agent episodes in the gyms, one token stream per trajectory.
- :mod:`.user_side` — :class:`~mimesis_lab.rollout.user_side.EndpointUser`, the simulator as a gym's
  user over an OpenAI-compatible endpoint.
- :mod:`.shim` — the privileged shim (SPEC §3.3.1) that keeps the simulator's reasoning from the agent.
- :mod:`.serve` — a minimal OpenAI-compatible server for a local model (the tiny profile's ``vllm serve``).
- :mod:`.think_guide` — format-guided decoding (``SamplingParams.think_format``): the grammar that keeps a
  simulator reply ``<think>reasoning</think>utterance``, for the user side of the gyms.
- :mod:`.agent_env` — the agent's environment for training and evaluation: gym rows, the user side behind the
  shim, one RL step's episodes, the leak check.

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
