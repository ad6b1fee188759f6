"""teacli/data/load.py: where a packaged prompt set is prepared (tea's cache, TEA_CACHE as teacli/cache.py reads it)."""

from __future__ import annotations

import os

import pytest


@pytest.mark.parametrize("setting, where", [("~/tc", "tc"), ("", ".cache/tea")])
def test_the_builtin_set_is_prepared_where_tea_cache_says(tmp_path, monkeypatch, setting, where):
    """TEA_CACHE='~/tc' created a literal ./~/tc/ directory and TEA_CACHE= wrote ./data/: data/load.py read the
    variable without expanding `~` or taking empty for unset, as models.py did."""
    from teacli.data.load import resolve_data_dir

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TEA_CACHE", setting)
    monkeypatch.chdir(cwd)
    out = resolve_data_dir("builtin")
    assert out == home / where / "data" / "builtin" and (out / "heldout.jsonl").is_file()
    assert os.listdir(cwd) == []
