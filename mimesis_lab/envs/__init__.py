"""Environments: simulator tasks (the ABCD realistic-behaviour task and other user-simulation
tasks, SPEC §2.3–2.4) and the agent gyms (SPEC §3.1).

- :mod:`.base` — the simulator-task interface and its registry keyed by ``data_source``.
- :mod:`.behavior_task` — the ABCD realistic-behaviour task; :mod:`.behavior` — its reward computed
  from the judge's four scores.
- :mod:`.usersim_tasks` — the three ThoughtTrace user-simulation tasks.
- :mod:`.registry` — task rows for the simulator-RL mixture.
- :mod:`.output_format` — the simulator's ``<think>reasoning</think>utterance`` format.
- :mod:`.gyms` — the eight UserRL-style agent gyms (DESIGN §5).
"""
