"""Stage 4: pivot selection (selection.py), data contracts (contracts.py), exports (exports.py), and each of them
applied to the warehouse's tables as the assets and the CLI share it (tables.py); assets.py is its Dagster face."""
