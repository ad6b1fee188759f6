"""teacli/cache.py: the one reader of TEA_CACHE."""

from __future__ import annotations

from pathlib import Path

import pytest

from teacli.cache import cache_dir, cache_setting


@pytest.fixture()
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_tilde_is_expanded_and_an_empty_setting_is_unset(home, monkeypatch):
    monkeypatch.setenv("TEA_CACHE", "~/tc")  # quoted in the shell: reaches tea unexpanded
    assert cache_dir() == home / "tc" and cache_setting() == "~/tc"
    monkeypatch.setenv("TEA_CACHE", "")
    assert cache_dir() == home / ".cache" / "tea" and cache_setting() is None
    monkeypatch.delenv("TEA_CACHE")
    assert cache_dir() == home / ".cache" / "tea" and cache_setting() is None
    monkeypatch.setenv("TEA_CACHE", "/somewhere/else")
    assert cache_dir() == Path("/somewhere/else")


def test_every_reader_of_tea_cache_goes_through_cache_py():
    """models.py expanded `~` and took empty for unset; data/load.py did neither (TEA_CACHE='~/tc' made a literal
    ./~/tc/, TEA_CACHE= wrote ./data/). Only teacli/cache.py may read the variable."""
    package = Path(__file__).resolve().parent.parent / "teacli"
    readers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                     if any(s in p.read_text() for s in ('environ.get("TEA_CACHE"', "environ['TEA_CACHE'", 'environ["TEA_CACHE"',
                                                         'getenv("TEA_CACHE"')))
    assert readers == []
