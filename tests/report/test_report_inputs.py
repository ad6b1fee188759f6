"""`tea report` on bad or damaged inputs: one line on stderr naming the file (and line), exit 2, and the
output directory either the whole new report or untouched; a reused --out keeps no file of an earlier report.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

sys.modules.setdefault("vllm", None)
sys.modules.setdefault("deepspeed", None)

import numpy as np
import pytest
from typer.testing import CliRunner

from teacli.cli import app

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_report_compare import M, SPLIT, write_run  # noqa: E402


def error_line(res) -> str:
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.output, res.output
    return lines[0]


@pytest.fixture()
def two(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(6, 3))
    root = tmp_path / "runs"
    return write_run(root, "grpo", a, rule="grpo"), write_run(root, "tea", a + 0.5, rule="tea")


def report(*args):
    return CliRunner().invoke(app, ["report", *map(str, args), "--bootstrap", "50"])


def records(run: Path) -> Path:
    return run / "eval" / f"{SPLIT}-M{M}.jsonl"


def bon(run: Path) -> Path:
    return run / "eval" / f"{SPLIT}-M{M}.bon.json"


@pytest.mark.parametrize("style", ["as written", "flow"])
def test_flow_style_recipe_fills_the_budget_column(two, tmp_path, style):
    # recipe.yaml as `tea train` writes it (sections of scalars in flow style, `eval: {split: ..., M: ...}`;
    # rollout in block style since it holds the vllm_kwargs mapping), and all in flow style,
    # `rollout: {engine: hf, ..., group_size: 64, ...}`.
    import yaml

    path = two[0] / "recipe.yaml"
    if style == "flow":
        path.write_text(yaml.safe_dump(yaml.safe_load(path.read_text()), sort_keys=False, default_flow_style=True))
        assert "rollout: {" in path.read_text()
    res = report(*two, "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    assert "| grpo | m=64 |" in (tmp_path / "r" / "frontier.md").read_text()


@pytest.mark.parametrize("edit, message", [
    (lambda t: re.sub(r"group_size: 64, |\n *group_size: 64(?=\n)", "", t), "rollout.group_size is missing"),
    (lambda t: "", "is empty"),
    (lambda t: t.replace("group_size: 64", "group_size: lots"), "rollout.group_size must be a positive integer, got 'lots'"),
    (lambda t: t.replace("advantage:", "advantage: {name: [tea]}\nx:"), "advantage.name must be a rule name"),
    (lambda t: t + "\n  : : [\n", "not valid YAML"),
])
def test_recipe_yaml_problems_name_the_file_and_key(two, tmp_path, edit, message):
    path = two[1] / "recipe.yaml"
    path.write_text(edit(path.read_text()))
    line = error_line(report(*two, "--out", tmp_path / "r"))
    assert str(path) in line and message in line
    assert not (tmp_path / "r").exists()


def test_missing_recipe_yaml_is_an_error(two, tmp_path):
    (two[1] / "recipe.yaml").unlink()
    line = error_line(report(*two, "--out", tmp_path / "r"))
    assert f"{two[1] / 'recipe.yaml'}: not found" in line


def test_corrupt_line_in_the_middle_of_the_records_names_file_and_line(two, tmp_path):
    lines = records(two[1]).read_text().splitlines(keepends=True)
    lines[7] = '{"prompt_id": "p1", "sample": 3, "resp\n'
    records(two[1]).write_text("".join(lines))
    line = error_line(report(*two, "--out", tmp_path / "r"))
    assert f"{records(two[1])}:8: not a JSON record" in line


def test_records_cut_short_are_counted_not_skipped(two, tmp_path):
    lines = records(two[1]).read_text().splitlines(keepends=True)
    records(two[1]).write_text("".join(lines[:-2]))  # two whole records lost: 22 of 24
    line = error_line(report(*two, "--out", tmp_path / "r"))
    assert f"{records(two[1])}: holds 22 of the 24 records its bon.json implies (6 prompts × M=4)" in line
    assert "prompt 'p5' has 2 of 4 samples" in line and "rerun `tea eval-bon`" in line
    records(two[1]).write_text("".join(lines[:-1]) + lines[-1][:20])  # the last record torn mid-line
    line = error_line(report(*two, "--out", tmp_path / "r"))
    assert f"{records(two[1])}:24: a record cut short" in line


def test_duplicate_record_and_missing_tokens(two, tmp_path):
    lines = records(two[1]).read_text().splitlines(keepends=True)
    records(two[1]).write_text("".join(lines[:5] + [lines[4]] + lines[6:]))
    assert f"{records(two[1])}:6: prompt 'p1' sample 0 appears twice" in error_line(report(*two, "--out", tmp_path / "r"))
    rec = json.loads(lines[4])
    del rec["tokens"]
    records(two[1]).write_text("".join(lines[:4] + [json.dumps(rec) + "\n"] + lines[5:]))
    assert f"{records(two[1])}:5: record has no 'tokens'" in error_line(report(*two, "--out", tmp_path / "r"))


@pytest.mark.parametrize("edit, message", [
    (lambda b: [b], "expected a JSON object written by `tea eval-bon`, got list"),
    (lambda b: {**b, "per_prompt": {**b["per_prompt"], "p2": [1.0, "abc", 2.0]}}, "per_prompt['p2'] holds 'abc'"),
    (lambda b: {**b, "per_prompt": {**b["per_prompt"], "p2": [1.0, float("nan"), 2.0]}}, "per_prompt['p2'] holds nan"),
    (lambda b: {**b, "per_prompt": {**b["per_prompt"], "p2": [1.0, 2.0]}}, "per_prompt['p2'] has 2 values for 3 N"),
    (lambda b: {**b, "per_prompt": ["p1"]}, "per_prompt must be a non-empty mapping"),
    (lambda b: {**b, "N": "1,2,4"}, "N must be a non-empty list of integers"),
])
def test_bad_bon_json_names_the_file(two, tmp_path, edit, message):
    bon(two[1]).write_text(json.dumps(edit(json.loads(bon(two[1]).read_text()))))
    line = error_line(report(*two, "--out", tmp_path / "r"))
    assert str(bon(two[1])) in line and message in line
    assert not (tmp_path / "r").exists()


def test_nan_in_bon_json_leaves_the_earlier_report_whole(two, tmp_path):
    out = tmp_path / "r"
    assert report(*two, "--out", out).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    b = json.loads(bon(two[1]).read_text())
    b["per_prompt"]["p3"][2] = float("nan")
    bon(two[1]).write_text(json.dumps(b))  # Python's json writes NaN, as a crashed writer might
    error_line(report(*two, "--out", out))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_failure_while_writing_leaves_the_earlier_report_whole(two, tmp_path, monkeypatch):
    from teacli.report import plots
    from teacli.report.build import build_report

    out = tmp_path / "r"
    build_report(list(two), out, resamples=50)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(plots, "plot_delta", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        build_report(list(two), out, baseline="tea", resamples=50)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r", "runs"]  # no staging directory left behind


def test_reused_out_keeps_no_stale_file(two, tmp_path):
    third = write_run(tmp_path / "runs", "other", np.zeros((6, 3)), rule="grpo_z")
    out = tmp_path / "r"
    assert report(*two, third, "--out", out).exit_code == 0
    assert (out / "deltas_other.md").exists()
    assert report(*two, "--out", out).exit_code == 0
    assert not (out / "deltas_other.md").exists() and (out / "deltas_tea.md").exists()
    assert "deltas_other.md" not in (out / ".tea-report").read_text()


def test_out_that_is_a_file_or_a_foreign_directory_is_refused(two, tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    assert f"--out {target}: is a file" in error_line(report(*two, "--out", target))
    foreign = tmp_path / "docs"
    foreign.mkdir()
    (foreign / "keep.md").write_text("mine")
    assert "holds files that `tea report` did not write" in error_line(report(*two, "--out", foreign))
    assert (foreign / "keep.md").read_text() == "mine" and target.read_text() == "mine"
    out = tmp_path / "r"
    assert report(*two, "--out", out).exit_code == 0
    (out / "my_notes.md").write_text("mine")  # a user's file inside an earlier report
    assert "holds my_notes.md, which the earlier report there did not write" in error_line(report(*two, "--out", out))
    assert (out / "my_notes.md").read_text() == "mine"


def test_a_full_disk_is_one_line_naming_out_and_the_earlier_report_stays(two, tmp_path, monkeypatch):
    """ENOSPC while writing (a failed write() names no file): one `error:` line naming --out, exit 2,
    the earlier report whole and no staging directory left (issue 22, item 9)."""
    import errno

    from teacli.report import plots

    out = tmp_path / "r"
    assert report(*two, "--out", out).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(plots, "plot_delta", full)
    line = error_line(report(*two, "--out", out, "--baseline", "tea"))
    assert line == f"error: {out}: no space left on device; free space there (or write elsewhere) and run the command again"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r", "runs"]


def run_json(run: Path, function: str | None, kind: str = "rule") -> Path:
    """The evaluation's settings as `tea eval-bon` writes them beside its records (the reward that scored it)."""
    path = run / "eval" / f"{SPLIT}-M{M}.run.json"
    reward = {"kind": kind, "name_or_path": None, "function": function, "revision": None, "max_length": 4096, "params": {}}
    path.write_text(json.dumps({"split": SPLIT, "M": M, "checkpoint": 100, "seed": 0, "reward": reward}))
    return path


def test_evaluations_scored_by_different_rewards_are_not_compared(two, tmp_path):
    """Before, `tea report` printed deltas and W/T/L between an evaluation scored with one reward and one scored
    with another (eval-bon --set reward.function=...), exit 0."""
    run_json(two[0], None)
    other = run_json(two[1], "mypkg.rewards:brevity", kind="python")
    line = error_line(report(*two, "--out", tmp_path / "r"))
    assert "runs grpo and tea were scored with different rewards" in line
    assert f"grpo with reward.kind='rule', reward.function=None ({two[0] / 'eval'}" in line
    assert f"tea with reward.kind='python', reward.function='mypkg.rewards:brevity' ({other})" in line
    assert not (tmp_path / "r").exists()
    run_json(two[1], None)  # the same reward: compared
    assert report(*two, "--out", tmp_path / "r").exit_code == 0


def test_a_base_arm_scored_by_another_reward_is_not_compared(two, tmp_path):
    run_json(two[0], None), run_json(two[1], None)
    arm = two[0].parent / "base_arm"
    shutil.copytree(two[0] / "eval", arm / "eval" / "base")
    shutil.copy(two[0] / "recipe.yaml", arm / "recipe.yaml")
    assert report(*two, "--base-arm", arm, "--out", tmp_path / "r").exit_code == 0
    (arm / "eval" / "base" / f"{SPLIT}-M{M}.run.json").write_text(json.dumps({"reward": {"kind": "hf", "name_or_path": "other/rm"}}))
    line = error_line(report(*two, "--base-arm", arm, "--out", tmp_path / "r"))
    assert "were scored with different rewards" in line and "reward.name_or_path='other/rm'" in line


def sampled_with(path: Path, chat_template: str | None = None, **sampling) -> Path:
    """Add what eval-bon records of the sampling (rollout.*) and, when the recipe sets one, policy.chat_template."""
    settings = json.loads(path.read_text())
    settings["sampling"] = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 256, **sampling}
    if chat_template is not None:
        settings["chat_template"] = chat_template
    path.write_text(json.dumps(settings))
    return path


@pytest.mark.parametrize("change, said", [
    ({"temperature": 0.5}, "sampling.temperature=1.0 ({run}), base_arm with sampling.temperature=0.5 ({arm})"),
    ({"top_p": 0.9, "top_k": 50}, "sampling.top_p=1.0, sampling.top_k=0 ({run}), base_arm with sampling.top_p=0.9, sampling.top_k=50 ({arm})"),
    ({"max_new_tokens": 64}, "sampling.max_new_tokens=256 ({run}), base_arm with sampling.max_new_tokens=64 ({arm})"),
    ({"stop_tokens": ["<|user|>"]}, "sampling.stop_tokens=None ({run}), base_arm with sampling.stop_tokens=['<|user|>'] ({arm})"),
    ({"chat_template": "{{ messages[0].content }}"}, "chat_template=None ({run}), base_arm with chat_template='{{{{ messages[0].content }}}}' ({arm})"),
])
def test_a_base_arm_sampled_otherwise_is_not_compared(two, tmp_path, change, said):
    """Before, `tea report --base-arm` compared every run with a base arm evaluated at temperature 0.5 (or another
    top_p / top_k, max_new_tokens, stop tokens or chat template) with exit 0: only the reward was checked."""
    ours = [sampled_with(run_json(r, None)) for r in two]
    arm = two[0].parent / "base_arm"
    shutil.copytree(two[0] / "eval", arm / "eval" / "base")
    shutil.copy(two[0] / "recipe.yaml", arm / "recipe.yaml")
    arm_json = arm / "eval" / "base" / f"{SPLIT}-M{M}.run.json"
    assert report(*two, "--base-arm", arm, "--out", tmp_path / "r").exit_code == 0  # the same settings: compared
    shutil.rmtree(tmp_path / "r")
    sampled_with(arm_json, **change)
    line = error_line(report(*two, "--base-arm", arm, "--out", tmp_path / "r"))
    assert "run grpo and the base arm base_arm were sampled with different settings" in line
    assert "grpo with " + said.format(run=ours[0], arm=arm_json) in line
    assert not (tmp_path / "r").exists()
    # an evaluation that records no sampling is not checked; one that does is
    ours[0].write_text(json.dumps({k: v for k, v in json.loads(arm_json.read_text()).items() if k not in ("sampling", "chat_template")}))
    assert "run tea and the base arm" in error_line(report(*two, "--base-arm", arm, "--out", tmp_path / "r"))
    sampled_with(ours[1], **change)
    assert report(*two, "--base-arm", arm, "--out", tmp_path / "r").exit_code == 0


@pytest.mark.parametrize("resamples", [1, 40])
def test_too_few_resamples_for_a_95_interval_are_refused(two, tmp_path, resamples):
    """`--bootstrap 1` printed "+0.085 [+0.091, +0.091]": an interval that excluded its estimate."""
    res = CliRunner().invoke(app, ["report", *map(str, two), "--bootstrap", str(resamples), "--out", str(tmp_path / "r")])
    line = error_line(res)
    assert f"--bootstrap {resamples}: a 95% percentile interval needs at least 41 resamples" in line
    res = CliRunner().invoke(app, ["report", *map(str, two), "--bootstrap", "41", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output


def test_too_many_resamples_are_refused_naming_the_maximum(two, tmp_path):
    """`--bootstrap 1000000000` tried to allocate [10^9, P] resampled indices (358 GiB): a MemoryError traceback."""
    res = CliRunner().invoke(app, ["report", *map(str, two), "--bootstrap", "1000000000", "--out", str(tmp_path / "r")])
    assert error_line(res).startswith("error: --bootstrap 1000000000: at most 100,000 resamples")
    assert not (tmp_path / "r").exists()
    res = CliRunner().invoke(app, ["report", *map(str, two), "--bootstrap", "100000", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output


def test_a_negative_seed_and_repeated_endpoints_are_one_line(two, tmp_path):
    assert "--seed -1: the bootstrap seed must be an integer >= 0" in error_line(report(*two, "--seed", "-1", "--out", tmp_path / "r"))
    line = error_line(report(*two, "--endpoints", "4,4,2", "--out", tmp_path / "r"))
    assert "--endpoints 4,4,2: 4 given twice" in line
    assert not (tmp_path / "r").exists()


def test_a_split_no_run_has_lists_the_evaluations_there_are(two, tmp_path):
    """Before, `--split heldout` listed "grpo: none; tea: none" for runs evaluated on another split."""
    line = error_line(report(*two, "--split", "heldout", "--out", tmp_path / "r"))
    assert "have no finished evaluation for split 'heldout'" in line
    assert f"Evaluations found: grpo: {SPLIT}-M{M}; tea: {SPLIT}-M{M}" in line
