"""Stage 4: pivot selection (selection.py), data contracts (contracts.py), exports (exports.py) and the
operations the assets and the CLI share (operations.py); assets.py is its Dagster face."""
