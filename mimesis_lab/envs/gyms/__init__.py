"""UserRL-style agent gyms (SPEC §3.1, DESIGN §5); the interface is :mod:`.base`.

``import mimesis_lab.envs.gyms.registry`` registers every bundled gym.
"""
