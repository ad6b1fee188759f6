import collections
import sys
import warnings
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cuda():
    """The CUDA device (the test is skipped without one); tests/ importable (tiny_lm)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    sys.path.insert(0, str(TESTS))
    return torch.device("cuda")


@pytest.fixture(autouse=True)
def release_the_card():
    """After each test, the memory it left cached goes back to the card: a later test that starts `tea train` in a
    subprocess (the 1B rehearsal) plans by the card's free memory, and ran out of it after the checkpointing test."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        import gc

        gc.collect()
        torch.cuda.empty_cache()


@pytest.fixture
def teacli_syncs():
    """count(fn): fn() run once to warm up, then again under torch.cuda.set_sync_debug_mode("warn"); the synchronizing
    calls tea's own code made in the second run, by file and line."""
    import torch

    def count(fn) -> collections.Counter:
        fn()  # warm-up: first-call allocations and lazy initialisation
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        return collections.Counter(
            f"{Path(w.filename).parent.name}/{Path(w.filename).name}:{w.lineno}" for w in caught
            if "synchroniz" in str(w.message).lower() and "teacli" in Path(w.filename).parts
        )

    return count
