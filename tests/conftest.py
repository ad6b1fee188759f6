import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_finish(session):
    """Some test modules prove that what they import never needs deepspeed by blocking it at import
    (`sys.modules.setdefault("deepspeed", None)`); that import happens during collection. Lift the
    block afterwards, so modules collected later that drive a real DeepSpeed engine in-process can."""
    import sys

    if "deepspeed" in sys.modules and sys.modules["deepspeed"] is None:
        del sys.modules["deepspeed"]
