"""mimesis_lab: the ML library of the MIMESIS reference implementation (no Prefect imports).

- Configuration and inputs: :mod:`.config`, :mod:`.config_eval` (one validated model per
  ``params.yaml`` section), :mod:`.io` (raw inputs without losing a row; the one parquet reader).
- Data transforms of the data stages: :mod:`.chat`, :mod:`.mixture`, :mod:`.thoughttrace`,
  :mod:`.behaviors`, :mod:`.abcd`, :mod:`.abcd_policy`, :mod:`.splits`, :mod:`.annotators`,
  :mod:`.expectations`.
- Models: :mod:`.tokenizer`, :mod:`.models`, :mod:`.packing`.
- :mod:`.endpoint`: the OpenAI-compatible endpoint client and its one retry loop.
- Subpackages: :mod:`.train` (DeepSpeed training), :mod:`.rl` (advantages, losses, RL jobs),
  :mod:`.rollout` (generation backends, episodes, the privileged shim), :mod:`.envs` (simulator
  tasks and agent gyms), :mod:`.judges`, :mod:`.evals`.
- :mod:`.tracking` (MLflow), :mod:`.progress` (progress lines).

The layout and its conventions: ``docs/design.md`` (DESIGN §2); the method: ``docs/spec.md``.
"""
__version__ = "0.1.0"
