"""Refresh rounds: the pool profiled again with the policy being trained, reselected, trained on (rounds.py); assets.py is its Dagster face."""
