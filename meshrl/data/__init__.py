"""Datasets: JSONL readers, and the built-in synthetic demo task (generated, so nothing to download)."""
