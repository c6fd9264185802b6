"""DVC data stages: one module per stage, named as the stage and its params.yaml section.

Run one with ``python -m stages.<name>`` from the project root (that is what dvc.yaml does).
"""
