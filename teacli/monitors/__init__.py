"""What watches runs and records without a model: the reward-hacking watch (`hacking.py`) and the Gaussian-tail
check while training (`tail_check.py`). Standard library, numpy and PyYAML: train/ and report/ both use them."""
