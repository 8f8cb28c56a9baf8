"""Stage 6: evaluation of the trained policies. Local accuracy on fixed held-out sets with bootstrap intervals
(heldout.py), the OOD probe (ood_probe.py) and the paper's ablation, which trains its arms with the training stage's
library and evaluates them here (ablation.py); assets.py is its Dagster face (`pivot_eval`, `ablation_results`)."""
