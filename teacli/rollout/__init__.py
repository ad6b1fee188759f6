"""Generation engines behind one protocol (see base.py); the only place that imports vllm."""

from teacli.rollout.base import RolloutEngine, build_engine, cut_at_eos, sampling_from

__all__ = ["RolloutEngine", "build_engine", "cut_at_eos", "sampling_from"]
