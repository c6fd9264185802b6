"""One runnable recipe per training phase, each readable top to bottom (its docstring opens with the
exact launch command); the training flow (``flows/train.py``) launches them with ``deepspeed`` or
``torchrun``.

- :mod:`.sft` — ``midtrain``, ``sft`` and ``agent_sft``: token-mean cross-entropy on the trained role.
- :mod:`.sim_rl` — joint multi-domain simulator RL with FoldGRPO and the behaviour reward.
- :mod:`.agent_grpo` — multi-turn GRPO of the agent against the frozen simulator.
- :mod:`.agent_csd` — the GRPO recipe plus coached on-policy self-distillation; the one place where
  ``loss = ppo + alpha * csd`` is put together.
"""
