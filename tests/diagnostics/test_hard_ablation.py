"""results/gpu/hard_ablation.py, the m-ablation's planned test, on run directories made here: the contrasts
are TEA − GRPO in grouped best-of-N per seed and prompt, and their difference between two m's; with no spread
over seeds or prompts the intervals are the point itself."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("hard_ablation", REPO / "results" / "gpu" / "hard_ablation.py")
ablation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ablation)

PROMPTS = ["p0", "p1", "p2"]


def write_run(root: Path, name: str, rewards: np.ndarray) -> None:
    """rewards[P, M] as `tea eval-bon` records of the selected checkpoint on the heldout split."""
    ev = root / name / "eval"
    ev.mkdir(parents=True)
    P, M = rewards.shape
    (ev / "heldout.prompts.jsonl").write_text("".join(json.dumps({"prompt_id": p}) + "\n" for p in PROMPTS[:P]))
    lines = [json.dumps({"prompt_id": PROMPTS[i], "sample": j, "response": None, "reward": float(rewards[i, j]), "tokens": 5})
             for i in range(P) for j in range(M)]
    (ev / f"heldout-M{M}.jsonl").write_text("\n".join(lines) + "\n")


def test_contrasts_are_best_of_n_differences_per_seed_and_prompt(tmp_path):
    # M = 4 samples; bo2 of a row [a, b, c, d] is (max(a, b) + max(c, d)) / 2
    grpo = np.array([[0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 0.5, 0.5], [0.0, 0.9, 0.1, 0.2]])
    tea = grpo + np.array([[0.0, 0.1, 0.0, 0.3], [0.0, 0.0, 0.0, 0.0], [0.2, 0.0, 0.0, 0.0]])
    for s in (0, 1):
        write_run(tmp_path, f"gpu_bon_hard_grpo_m16-s{s}", grpo)
        write_run(tmp_path, f"gpu_bon_hard_tea_m16-s{s}", tea)
    write_run(tmp_path, "gpu_bon_hard_tea_m16-s2", tea)  # no GRPO of seed 2: left out
    d, seeds, ids = ablation.contrasts(tmp_path, 16, 2)
    # prompt 0: TEA (0.3 + 0.7) / 2 = 0.5 against GRPO (0.2 + 0.4) / 2 = 0.3; prompt 1: 0; prompt 2: (0.9 + 0.2) / 2 both
    assert seeds == [0, 1] and ids == PROMPTS
    np.testing.assert_allclose(d, [[0.2, 0.0, 0.0]] * 2, atol=1e-12)


def test_the_difference_of_contrasts_between_two_ms_and_its_degenerate_interval(tmp_path):
    base = np.full((3, 4), 0.4)
    for s in (0, 1, 2):
        write_run(tmp_path, f"gpu_bon_hard_grpo_m16-s{s}", base)
        write_run(tmp_path, f"gpu_bon_hard_tea_m16-s{s}", base + 0.05)
        write_run(tmp_path, f"gpu_bon_hard_grpo-s{s}", base)
        write_run(tmp_path, f"gpu_bon_hard_tea-s{s}", base + 0.01)
    text = ablation.table(tmp_path, [16, 64], 2, 200, 0)
    rows = [line.split(" | ") for line in text.splitlines()[2:]]
    assert [r[0] for r in rows] == ["| D(16) = TEA − GRPO at m = 16", "| D(64) = TEA − GRPO at m = 64", "| D(16) − D(64)"]
    # every seed and prompt the same: the estimates are the shifts, and resampling cannot move them
    assert [(r[2], r[3]) for r in rows] == [("+0.050", "[+0.050, +0.050] |"), ("+0.010", "[+0.010, +0.010] |"), ("+0.040", "[+0.040, +0.040] |")]


def test_no_pair_at_an_m_is_an_error_naming_the_runs(tmp_path):
    write_run(tmp_path, "gpu_bon_hard_tea_m32-s0", np.zeros((3, 4)))
    with pytest.raises(SystemExit, match="no seed with both gpu_bon_hard_tea_m32 and gpu_bon_hard_grpo_m32 runs"):
        ablation.contrasts(tmp_path, 32, 2)


def test_every_m_is_read_over_the_ablation_s_seeds(tmp_path):
    """The plan compares the arms at the ablation's seeds (its study file's, [0, 1, 2]): a fourth seed of the main study's
    m = 64 runs is left out of D(64), and of D(16) − D(64)."""
    assert ablation.plan_seeds() == [0, 1, 2]
    base = np.full((3, 4), 0.4)
    for s in (0, 1, 2, 3):
        write_run(tmp_path, f"gpu_bon_hard_grpo-s{s}", base)
        write_run(tmp_path, f"gpu_bon_hard_tea-s{s}", base + (0.5 if s == 3 else 0.01))
    write_run(tmp_path, "gpu_bon_hard_grpo_m16-s0", base)
    write_run(tmp_path, "gpu_bon_hard_tea_m16-s0", base + 0.05)
    rows = [line.split(" | ") for line in ablation.table(tmp_path, [16, 64], 2, 200, 0).splitlines()[2:]]
    assert [(r[1], r[2]) for r in rows] == [("0", "+0.050"), ("0, 1, 2", "+0.010"), ("0 / 0, 1, 2", "+0.040")]
