"""Reinforcement-learning pieces for the simulator (Stage I) and the agent (Stage II); the recipes
that use them are in :mod:`mimesis_lab.jobs`.

- :mod:`.advantages` — FoldGRPO (simulator RL, SPEC §2.3) and multi-turn GRPO with R2G turn
  credit (agent RL, SPEC §3.2); pure Python, lists in, lists out.
- :mod:`.losses` — token-level PPO clip loss (SPEC §3.2), the CSD ``sdar`` self-distillation loss
  and its gate (SPEC §3.3 items 5–7); torch tensors in, a scalar out.
- :mod:`.policy` — the one update-row type (a simulator rollout as one prefix-tree row), padding,
  ``token_logprobs``, minibatches.
- :mod:`.ppo` — the PPO-clip update over a rollout batch (no CSD names), the policy engine.
- :mod:`.sim_batch` / :mod:`.agent_batch` — from judged rollouts / trajectories to update rows and
  per-step metrics.
- :mod:`.csd` — CSD building blocks: turn alignment and selection, teacher rows and index maps,
  teacher log-probs, the placebo pool.
"""
