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


def test_runs_started_together_prepare_the_builtin_set_once(tmp_path, monkeypatch):
    """Four runs of a study start at once on a fresh machine: each found the cache empty and prepared the set into
    the same place, and one's rename found its temporary file gone (a GPU study lost two of four runs). Now they
    wait for one another: one prepares it and the others find it there."""
    import importlib
    import threading
    import time

    from teacli.data.load import resolve_data_dir

    prepare_module = importlib.import_module("teacli.data.prepare")  # the module (teacli.data exports a function of that name)

    monkeypatch.setenv("TEA_CACHE", str(tmp_path / "cache"))
    real, inside, most, calls = prepare_module.prepare, [0], [0], []
    guard = threading.Lock()

    def slow_prepare(*args, **kwargs):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            calls.append(args[0])
        time.sleep(0.3)  # long enough for the other threads to find the cache empty
        try:
            return real(*args, **kwargs)
        finally:
            with guard:
                inside[0] -= 1

    monkeypatch.setattr(prepare_module, "prepare", slow_prepare)
    outs, errors = [], []

    def run():
        try:
            outs.append(resolve_data_dir("builtin"))
        except Exception as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(outs)) == 1
    assert most[0] == 1 and calls == ["builtin"]
    assert (outs[0] / "manifest.json").exists()
