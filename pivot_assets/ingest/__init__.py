"""Stage 1: readers and format dialects (formats/), the configured inputs (inputs.py), turn extraction
(turn_extraction.py), the embedded sample (sample_data.py); assets.py is its Dagster face."""
