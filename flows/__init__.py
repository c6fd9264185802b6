"""Prefect flows: orchestration only (order, retries, caching, artifacts); no ML code here.

The training, RL and evaluation flows plug in here; DVC stages whose command runs a
flow continue ``dvc repro`` past the data stages.
"""
