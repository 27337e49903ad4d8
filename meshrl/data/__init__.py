"""Datasets: JSONL and Parquet files (the peers' formats too), and the built-in synthetic demo task (generated,
so nothing to download)."""
