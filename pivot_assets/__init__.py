"""pivot-curation: PivotRL's data side as a Dagster pipeline.

Dagster-free libraries (formats, turn_extraction, verifiers, policies, ...) live beside the
per-stage asset modules (ingest, turns, profiling, pivots, training) that call them.
"""
