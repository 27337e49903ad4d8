"""A dataset file, by its suffix: JSONL (``.jsonl``, ``.json``: one JSON object a line, jsonl.py) or
Parquet (``.parquet``: one row a record, the format of verl's and Hugging Face's datasets; read with
pyarrow, an optional dependency). Either way each record goes through jsonl.check_record (the
peers' field names mapped first: peer_fields.py), and a bad one stops the run naming the file and
the line or row."""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from .jsonl import check_record, read_jsonl

PARQUET = (".parquet", ".pq")


def read_dataset(path: str | Path, kind: str, renames: tuple[tuple[str, str], ...] = ()) -> list[dict]:
    """Records of ``kind`` (prompts | sft | pairs) from a JSONL or Parquet file. ``renames``: (the
    file's field, meshrl's) pairs, data.prompt_key / answer_key (DataConfig.renames)."""
    if Path(path).suffix.lower() in PARQUET:
        return read_parquet(path, kind, renames)
    return read_jsonl(path, kind, renames)


def read_parquet(path: str | Path, kind: str, renames: tuple[tuple[str, str], ...] = ()) -> list[dict]:
    """Records of ``kind`` from a Parquet file: each row a dict of its columns (nested columns as
    lists and dicts, as pyarrow's ``to_pylist`` gives them)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"dataset file not found: {path}")
    try:
        import pyarrow.parquet as pq  # optional: only Parquet datasets need it (the [data] extra)
    except ImportError:
        raise UserError(f"{path}: reading a Parquet dataset needs pyarrow: pip install pyarrow "
                        "(or pip install -e '.[data]')") from None
    try:
        rows = pq.read_table(p).to_pylist()
    except Exception as e:  # pyarrow raises its own error types for a file that is not Parquet
        raise UserError(f"{path}: not a readable Parquet file ({type(e).__name__}: {e})") from None
    if not rows:
        raise UserError(f"dataset {path} has no records")
    return [check_record(row, f"{path}:row {n}", kind, renames) for n, row in enumerate(rows, start=1)]
