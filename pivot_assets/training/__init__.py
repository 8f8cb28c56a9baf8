"""Stage 5: same-data SFT (sft.py), local GRPO (grpo.py), evaluation and the OOD probe (evaluation.py,
ood_probe.py), run keys and markers (runs.py) (the held-out split is core/split.py); assets.py is its Dagster face."""
