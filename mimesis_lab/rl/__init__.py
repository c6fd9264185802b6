"""Reinforcement learning for the simulator (Stage I) and the agent (Stage II).

- :mod:`.advantages` — FoldGRPO (simulator RL, SPEC §2.3) and multi-turn GRPO with R2G turn
  credit (agent RL, SPEC §3.2); pure Python, lists in, lists out.
- :mod:`.losses` — token-level PPO clip loss (SPEC §3.2) and the CSD ``sdar`` self-distillation
  loss with optional placebo correction (SPEC §3.3 items 5–7); torch tensors in, a scalar out.

Everything here is a pure function with the paper's equation in its docstring; no I/O.
"""
