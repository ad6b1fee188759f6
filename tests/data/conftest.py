"""Fixtures for the prepare-data tests (schemas: see datafixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from datafixtures import binarized_test_rows, uf_rows, write_parquet


@pytest.fixture
def uf_files(tmp_path: Path) -> tuple[Path, Path]:
    """(UltraFeedback train parquet, binarized test_prefs parquet) in tmp_path/in/."""
    train = write_parquet(tmp_path / "in" / "ultrafeedback-train.parquet", uf_rows())
    test = write_parquet(tmp_path / "in" / "test_prefs.parquet", binarized_test_rows())
    return train, test
