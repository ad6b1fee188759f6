"""Generation engines behind one protocol (base.py), built by factory.py; vllm_engine.py is the only
module that imports vllm."""

from teacli.rollout.base import RolloutEngine, cut_at_eos, sampling_from
from teacli.rollout.factory import build_engine, resolve_engine_name

__all__ = ["RolloutEngine", "build_engine", "cut_at_eos", "resolve_engine_name", "sampling_from"]
