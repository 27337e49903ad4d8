"""The README's dry-run table is bench/dry_run_grid.py's by-model summary of the rows in
docs/dry_run_grid.md (the page the grid's runs wrote), so neither can drift from the other."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import dry_run_grid  # noqa: E402


def _row(model: str, gpus: int, errs: str, result: str = "fits, ok") -> str:
    return f"| scale both | {model} | {gpus} | 128 | search | 4 | {errs} | actor_gen 1.0/1.0 (-0%) | {result} |"


def test_the_readme_table_is_the_pages_summary():
    page = (ROOT / "docs" / "dry_run_grid.md").read_text()
    rows = dry_run_grid.page_rows(page)
    assert len(rows) >= 70  # every cell of ReaL's grid, heuristic and searched, and the MoE presets
    table = "\n".join(dry_run_grid.summary(rows))
    assert table in (ROOT / "README.md").read_text()
    assert table in page


def test_summary_takes_the_worst_and_counts_what_failed():
    rows = [_row("7B", 8, "0.1% / 0.4%"), _row("7B", 16, "0.3% / 2.5% (ref_inf on rank 2: 1.0/1.1 GiB)"),
            _row("70B", 128, "0.2% / 1.0%", "fits, FAILED: rank 3 holds a whole weight"),
            "| scale both | 70B | 64 | 128 | - | - | - | - | no plan fits |"]
    head, sep, small, big = dry_run_grid.summary(rows)
    assert head == dry_run_grid.SUMMARY_HEAD and sep.startswith("|---")
    assert small == "| 7B | 8/16 | 2 | 0.3% | 2.5% | 2 of 2 |"
    assert big == "| 70B | 64/128 | 2 | 0.2% | 1.0% | 0 of 2 |"
