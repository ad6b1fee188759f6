import os

import pytest


@pytest.fixture(scope="module")
def world():
    """A one-process gloo group for tests that drive a real DeepSpeed engine in-process (CPU)."""
    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    from teacli.train import backend

    yield backend.init_world()
    for k, v in saved.items():  # later subprocesses must not inherit this process group's variables
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
