"""DeepSpeed training of the simulator: user-side mid-training (``midtrain``) and ThoughtTrace
SFT (``sft``) share one loop.

- :mod:`.schedule` — warm-up + cosine lr, a pure function of the step.
- :mod:`.data` — split parquet → mixture expansion → chat tokenisation → fit/pack → a
  deterministic, world-size-independent data plan (which rows each rank sees at each step).
- :mod:`.loop` — the DeepSpeed engine, global token-mean loss, validation, checkpoints with
  exact resume, the Hugging Face export (see its docstring for what runs on CPU).
- :mod:`.run` — the per-rank job entry point (``python -m mimesis_lab.train.run``).
- :mod:`.launch` — builds and runs the ``deepspeed`` / ``torchrun`` command line.

Nothing here imports deepspeed at module import time except :mod:`.loop`'s functions.
"""
