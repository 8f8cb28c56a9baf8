"""The floor every stage stands on (Dagster-free): config, ids and shapes, the table catalog, the warehouse, plots."""
