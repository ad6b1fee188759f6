import sys
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
