"""Stage 3: reference-policy rollouts, verifier rewards and per-turn profiles (profiler.py); assets.py is its Dagster face."""
