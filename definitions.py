"""The one Dagster entry point (workspace.yaml -> here). The config file is $PIVOT_CONFIG or ./pivot.yaml."""

from pivot_jobs.definitions import build_definitions

defs = build_definitions()
