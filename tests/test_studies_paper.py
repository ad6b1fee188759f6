"""Every shipped study resolves, and its report compares the runs the paper compares.

The table below is the paper's pairings, written from its Experiments section: which method is compared
with which baseline, on which split, with which M and checkpoint, at which endpoints. A method is named
by its recipe's settings (advantage rule, m, parameters), never by a run name, and the test checks the
chain a user runs: the study file → `tea study --dry-run`'s report command (--baseline, --pair) → the
report's pairing rule (teacli.report.compare.baselines_of).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from teacli.cli import app
from teacli.config import load_recipe
from teacli.report.compare import baselines_of
from teacli.study import load_study, plan, shipped_studies

REPO = Path(__file__).resolve().parent.parent
UF, HH = "data/ultrafeedback", "data/hh_helpful"
LLAMA1B, QWEN4B, LLAMA8B = "meta-llama/Llama-3.2-1B-Instruct", "Qwen/Qwen3-4B-Instruct-2507", "meta-llama/Llama-3.1-8B-Instruct"
SKY_LLAMA, SKY_QWEN = "Skywork/Skywork-Reward-V2-Llama-3.1-8B", "Skywork/Skywork-Reward-V2-Qwen3-8B"


def method(rule: str, m: int = 64, *, policy: str = LLAMA1B, reward: str = SKY_LLAMA, data: str = UF, **params) -> tuple:
    return (rule, m, policy, reward, data, tuple(sorted(params.items())))


GRPO, TEA = method("grpo"), method("tea", alpha=0.25, n_target=128)
PREFIX = method("prefix_tea", alpha=0.25, n_target=128, k=2, J=4)
GRPO_Z = method("grpo_z")
TTA = [method("bon_max_mean"), method("bon_max_second"), method("bon_mean", k=32), method("chow", n_sel=32, m_corr=32),
       method("cat_bon", n_target=128)]
BON_MEAN_2X, CHOW_2X = method("bon_mean", 128, k=64), method("chow", 128, n_sel=64, m_corr=64)


def matched(**setting) -> dict:
    return {method("tea", alpha=0.25, n_target=128, **setting): method("grpo", **setting)}


# study → (split, M, checkpoint, endpoints or None, {compared method: its baseline}, paper labels)
PAPER = {
    "uf_core250": ("core250", 256, "selected", [64, 128, 256],
                   {TEA: GRPO, PREFIX: GRPO, GRPO_Z: GRPO, BON_MEAN_2X: GRPO, **{t: GRPO for t in TTA}},
                   ["core250_bestofk_curve", "main_core250_endpoint_summary", "core250_full_baseline_results",
                    "core250_win_tie_loss", "core250_length_check"]),
    "uf_core500": ("core500", 256, "selected", [128, 256], {TEA: GRPO, PREFIX: GRPO, GRPO_Z: GRPO}, ["core500_confirmation"]),
    "uf_step450": ("core500", 256, "step_450", [128, 256], {TEA: GRPO, PREFIX: GRPO, GRPO_Z: GRPO}, ["step450_sanity"]),
    "uf_m_to_n": ("core250", 512, "selected", [128, 256, 512],
                  {method("tea", m, alpha=0.25, n_target=128): method("grpo", m) for m in (16, 32, 64)},
                  ["m_to_n_scaling", "m_to_n_scaling_full", "m_to_n_bo512_wtl"]),
    "uf_target_n": ("core250", 512, "selected", [32, 128, 256, 512],
                    {method("tea", alpha=0.25, n_target=n): GRPO for n in (128, 256, 512)}, ["target_n_ablation"]),
    "uf_stress_m128": ("core250", 256, "selected", [64, 128, 256], {BON_MEAN_2X: GRPO, CHOW_2X: GRPO, TEA: GRPO},
                       ["main_additional_checks"]),
    "hh_llama1b": ("heldout", 256, "selected", None, matched(data=HH),
                   ["hh_helpful_robustness", "hh_helpful_full_robustness", "dataset_rm_robustness"]),
    "uf_qwenrm": ("core250", 256, "selected", None, matched(reward=SKY_QWEN),
                  ["qwen3_rm_robustness", "qwen3_rm_full_robustness"]),
    "uf_qwen4b": ("core250", 256, "selected", None, matched(policy=QWEN4B),
                  ["policy_backbone_robustness", "qwen4b_policy_robustness"]),
    "uf_llama8b_lora": ("core250", 256, "selected", [32, 64, 128, 256], matched(policy=LLAMA8B),
                        ["llama8b_policy_robustness", "llama8b_policy_robustness_frontier", "llama8b_policy_robustness_ci"]),
}
UNMATCHED_BUDGET = {BON_MEAN_2X, CHOW_2X}  # the paper's compute-unmatched m = 128 stress tests, against GRPO m = 64


def describe(recipe) -> tuple:
    return (recipe.advantage.name, recipe.rollout.group_size, recipe.policy.name_or_path, recipe.reward.name_or_path,
            recipe.data.dir, tuple(sorted(recipe.advantage.params.items())))


def _option(cmd: list[str], flag: str) -> list[str]:
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == flag]


NOT_PAPER = {"embedded_bon", "gpu_bon_rule", "gpu_bon_judge", "gpu_bon150_rule", "gpu_bon150_judge", "gpu_bon_hard", "gpu_bon_hard_m", "gpu_bon_hard_step", "gpu_bon_hard_kl"}  # the embedded CPU comparison and the GPU studies: tests/test_study.py


def test_every_shipped_study_is_in_the_paper_table():
    assert sorted(p.stem for p in shipped_studies() if p.stem not in NOT_PAPER) == sorted(PAPER)
    assert NOT_PAPER <= {p.stem for p in shipped_studies()}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_study_resolves_and_pairs_what_the_paper_pairs(name):
    split, M, checkpoint, endpoints, pairs, _labels = PAPER[name]
    res = CliRunner().invoke(app, ["study", name, "--dry-run"])
    assert res.exit_code == 0, res.output
    study = load_study(REPO / "recipes" / "studies" / f"{name}.yaml")
    recipes = {run: load_recipe(path) for run, path in zip(study.runs, study.recipes)}
    assert all(f"train {run}" in res.output and f"eval-bon {run}" in res.output for run in recipes)

    report = plan(study)[-1].cmd
    assert f"run   report: {shlex.join(report)}" in res.output
    assert report[3:4 + len(study.runs)] == ["report", *(str(study.runs_dir / r) for r in study.runs)]
    assert (_option(report, "--split"), _option(report, "--n"), _option(report, "--checkpoint")) == ([split], [str(M)], [checkpoint])
    assert _option(report, "--endpoints") == ([",".join(map(str, endpoints))] if endpoints else [])
    for st in plan(study):
        label, cmd = st.label, st.cmd
        if label.startswith("eval-bon"):
            assert _option(cmd, "--n") == [str(M)] and _option(cmd, "--split") == [split]
            assert _option(cmd, "--checkpoint") == ([] if checkpoint == "selected" else [checkpoint])

    # The pairing the report will use, from the command the study runs.
    run_of = {str(study.runs_dir / r): r for r in study.runs}
    default = run_of[_option(report, "--baseline")[0]]
    given = dict(p.split("=", 1) for p in _option(report, "--pair"))
    base_of = baselines_of(study.runs, default, {run_of[a]: run_of[b] for a, b in given.items()})
    got = {describe(recipes[r]): describe(recipes[b]) for r, b in base_of.items() if b is not None}
    assert got == pairs

    for run, base in base_of.items():
        if base is None:
            assert describe(recipes[run]) in pairs.values(), f"{run} is neither compared nor a baseline"
            continue
        a, b = recipes[run].to_dict(), recipes[base].to_dict()
        for r in (a, b):  # what may differ between a method and its baseline
            for key in ("name", "description", "advantage", "eval"):
                r.pop(key)
            if describe(recipes[run]) in UNMATCHED_BUDGET:
                r["rollout"].pop("group_size")
        assert a == b, f"{run} and its baseline {base} differ in more than the advantage rule"


def test_compute_unmatched_recipes_keep_the_prompts_per_step():
    """BoN mean 2x and Chow m = 128: twice the rollouts per prompt, the same prompts per step as m = 64."""
    grpo = load_recipe(REPO / "recipes" / "uf_llama1b_grpo.yaml")
    for name, params in (("uf_llama1b_bon_mean_2x", {"k": 64}), ("uf_llama1b_chow_2x", {"n_sel": 64, "m_corr": 64})):
        r = load_recipe(REPO / "recipes" / f"{name}.yaml")
        assert r.rollout.group_size == 2 * grpo.rollout.group_size == 128
        assert r.rollout.prompts_per_step == grpo.rollout.prompts_per_step
        assert r.advantage.params == params


def test_docs_map_every_paper_result_to_its_study():
    text = (REPO / "docs" / "recipes.md").read_text()
    for name, (*_rest, labels) in PAPER.items():
        assert f"`{name}`" in text, f"docs/recipes.md does not name the study {name}"
        for label in labels:
            assert f"`{label}`" in text, f"docs/recipes.md does not map {label}"
    for label in ("deepseek_v4pro_checks", "mechanism_diagnostics", "prefix_tea_summary"):
        assert f"`{label}`" in text
