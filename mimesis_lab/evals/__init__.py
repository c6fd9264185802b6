"""Evaluation of simulators and agents (SPEC §4): metrics are pure functions, I/O at the edges.

- :mod:`.metrics` — the formulas (fidelity index, Dice, ECE, USI5, Turing distance, Mean and Mean Rank,
  cluster bootstrap; DESIGN §4).
- :mod:`.sim_eval` — the simulator benchmarks of ``sim_eval``; :mod:`.fidelity_judge`, :mod:`.discriminator`
  and :mod:`.user_stats` are its judges and statistics; :mod:`.think_format` checks that an SFT simulator
  thinks before it speaks.
- :mod:`.agent_eval` — agents × evaluation users × gyms, cached per rollout; :mod:`.eval_users` plays the
  gyms' user side.
- :mod:`.report` — the comparison report and its plots.
"""
