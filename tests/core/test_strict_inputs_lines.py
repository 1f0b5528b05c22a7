"""Issue 32: a 10-million-line file took 150 s and 6.7 GB before it was refused. A JSON Lines
receipt or run file is refused by its line count before any line is parsed."""

from __future__ import annotations

import time

import pytest

from tica import strict_io
from tica.errors import InputError
from tica.receipts import ReceiptError, load_jsonl


def test_a_jsonl_receipt_past_the_line_bound_is_refused_before_parsing(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n' * (strict_io.MAX_LINES + 1))
    t = time.perf_counter()
    with pytest.raises(ReceiptError, match="more than the 1000000"):
        load_jsonl(path)
    assert isinstance(ReceiptError(path, "f", "m"), InputError)
    elapsed = time.perf_counter() - t
    print(f"refused {strict_io.MAX_LINES + 1} lines in {elapsed:.2f} s")  # measured, never asserted


def test_a_file_at_the_bound_is_read(tmp_path):
    """Control: the bound itself is not refused (a row on every line of it)."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n' * 1000)
    assert len(load_jsonl(path)) == 1000
    assert len(strict_io.lines_of("a\n" * 10, limit=10)) == 10
    with pytest.raises(strict_io.StrictInputError):
        strict_io.lines_of("a\n" * 11, limit=10)
