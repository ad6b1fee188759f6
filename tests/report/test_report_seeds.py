"""`tea report` pools the seeds of one recipe into one method and compares every method with a base arm;
run directories written by hand with known per-prompt values, expected numbers worked out here."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

sys.modules.setdefault("vllm", None)
sys.modules.setdefault("deepspeed", None)

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from teacli.cli import app
from teacli.config import SCHEMA_KEY, SCHEMA_VERSION, Recipe, schema_default, to_yaml
from teacli.eval.stats import seed_prompt_bootstrap

SPLIT, M = "heldout", 4
NS = [1, 2, 4]
RESAMPLES, SEED = 1000, 0


def write_run(root: Path, dirname: str, recipe_name: str, seed: int, values: list[list[float]], *, rule: str,
              tokens: int, checkpoint="40", sub: str = "") -> Path:
    """A run directory as `tea train` + `tea eval-bon` leave it: recipe.yaml (to_yaml), bon.json, records."""
    run = root / dirname
    ev = run / "eval" / sub
    ev.mkdir(parents=True)
    recipe = Recipe()
    recipe.name, recipe.seed, recipe.rollout.group_size = recipe_name, seed, 16
    recipe.advantage.name = rule
    recipe.advantage.params = {"alpha": 0.25, "n_target": 128} if rule == "tea" else {}
    (run / "recipe.yaml").write_text(to_yaml(recipe))
    ids = [f"p{i}" for i in range(len(values))]
    with open(ev / f"{SPLIT}-M{M}.jsonl", "w") as f:
        for pid in ids:
            for s in range(M):
                f.write(json.dumps({"prompt_id": pid, "sample": s, "response": "x", "reward": 0.5, "tokens": tokens}) + "\n")
    bon = {"split": SPLIT, "M": M, "checkpoint": int(checkpoint) if checkpoint != "base" else "base", "N": NS,
           "mean": np.mean(values, axis=0).tolist(), "per_prompt": dict(zip(ids, values))}
    (ev / f"{SPLIT}-M{M}.bon.json").write_text(json.dumps(bon))
    return run


# per prompt (p0..p3), per N (1, 2, 4)
GRPO = {0: [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.2, 0.2, 0.2], [0.0, 0.1, 0.2]],
        1: [[0.3, 0.4, 0.5], [0.2, 0.3, 0.4], [0.2, 0.2, 0.2], [0.2, 0.3, 0.4]]}
TEA = {0: [[0.3, 0.4, 0.7], [0.2, 0.5, 0.6], [0.1, 0.2, 0.1], [0.1, 0.3, 0.5]],
       1: [[0.5, 0.4, 0.9], [0.4, 0.3, 0.4], [0.3, 0.2, 0.3], [0.1, 0.3, 0.5]]}
BASE = [[0.0, 0.1, 0.2], [0.1, 0.2, 0.3], [0.0, 0.0, 0.1], [0.1, 0.1, 0.1]]


@pytest.fixture()
def study(tmp_path):
    root = tmp_path / "runs"
    runs = [write_run(root, f"g-s{s}", "g", s, GRPO[s], rule="grpo", tokens=10 + 10 * s, checkpoint="20" if s else "40") for s in (0, 1)]
    runs += [write_run(root, f"t-s{s}", "t", s, TEA[s], rule="tea", tokens=30, checkpoint="40") for s in (0, 1)]
    base = write_run(root, "g-base", "g", 0, BASE, rule="grpo", tokens=12, checkpoint="base", sub="base")
    return runs, base


def report(*args) -> "object":
    return CliRunner().invoke(app, ["report", *map(str, args)])


def by_method(path: Path, key: str = "Method") -> dict[str, dict[str, str]]:
    return {row[key]: row for row in csv.DictReader(open(path))}


def at(values: dict[int, list[list[float]]] | list[list[float]], j: int) -> np.ndarray:
    """[S, P] per-seed per-prompt values at N index j (a list of prompts: one run, [1, P])."""
    runs = [values[s] for s in sorted(values)] if isinstance(values, dict) else [values]
    return np.array([[p[j] for p in run] for run in runs])


def bootstrap(d: np.ndarray) -> tuple[float, float, float]:
    idx = np.random.default_rng(SEED).integers(0, len(d), size=(RESAMPLES, len(d)))
    means = d[idx].mean(axis=1)
    return float(d.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def test_seeds_pool_into_one_method_with_seed_averaged_values(study, tmp_path):
    runs, base = study
    res = report(*runs, "--baseline", "g", "--base-arm", base, "--out", tmp_path / "r", "--endpoints", "2,4")
    assert res.exit_code == 0, res.output
    out = tmp_path / "r"
    frontier = by_method(out / "frontier.csv")
    assert list(frontier) == ["g", "t", "g-base"]
    # Pooled bo1 of g: per prompt (0.1+0.3)/2, (0.4+0.2)/2, (0.2+0.2)/2, (0.0+0.2)/2 = 0.2, 0.3, 0.2, 0.1 → mean 0.2.
    assert float(frontier["g"]["bo1"]) == pytest.approx(0.2)
    # t at bo4: (0.7+0.9)/2, (0.6+0.4)/2, (0.1+0.3)/2, (0.5+0.5)/2 = 0.8, 0.5, 0.2, 0.5 → 0.5.
    assert float(frontier["t"]["bo4"]) == pytest.approx(0.5)
    assert frontier["g"]["Step"] == "s0:40 s1:20" and frontier["g-base"]["Step"] == "base" and frontier["g-base"]["Budget"] == "untrained"

    # t − g at bo4 per prompt: 0.8−0.4, 0.5−0.5, 0.2−0.2, 0.5−0.3 = 0.4, 0, 0, 0.2 → delta 0.15. Both seeds'
    # own differences average 0.15 too (seed 0: 0.4, 0, −0.1, 0.3; seed 1: 0.4, 0, 0.1, 0.1), so the seed
    # level (auto → seeds then prompts: both methods have two seeds) has no spread to add: the interval is the
    # prompt bootstrap of these four seed-averaged differences (not of the 8 per-seed ones).
    d4 = np.array([0.4, 0.0, 0.0, 0.2])
    endpoints = by_method(out / "endpoints.csv")
    got = [float(endpoints["t"][k]) for k in ("Δbo4", "Δbo4 lo", "Δbo4 hi")]
    assert got == pytest.approx(bootstrap(d4)) and got[0] == pytest.approx(0.15)
    # bo2: seed 0's difference averages 0.1, seed 1's 0: the seeds disagree, and the paired two-level interval
    # (seed s of t with seed s of g) is wider than the prompt bootstrap of the seed-averaged differences.
    got2 = [float(endpoints["t"][k]) for k in ("Δbo2", "Δbo2 lo", "Δbo2 hi")]
    assert got2 == pytest.approx(seed_prompt_bootstrap(at(TEA, 1), at(GRPO, 1), [0, 1], [0, 1], RESAMPLES, SEED))
    prompt_only = bootstrap(np.array([0.1, 0.0, 0.0, 0.1]))  # the seed-averaged differences (below)
    assert got2[2] - got2[1] > prompt_only[2] - prompt_only[1]
    # W/T/L on the seed-averaged values: bo4 → 2 wins, 2 ties (p1, p2), 0 losses. p2 is a loss for seed 0
    # (0.1 vs 0.2) and a win for seed 1 (0.3 vs 0.2): only its seed averages tie.
    wtl = by_method(out / "win_tie_loss.csv", "Comparison")
    assert [int(wtl["t vs g"][f"bo4 {k}"]) for k in "WTL"] == [2, 2, 0]
    # bo2: t averaged 0.4, 0.4, 0.2, 0.3 vs g 0.3, 0.4, 0.2, 0.2 → W/T/L 2/2/0, delta 0.05.
    assert [int(wtl["t vs g"][f"bo2 {k}"]) for k in "WTL"] == [2, 2, 0]
    assert float(endpoints["t"]["Δbo2"]) == pytest.approx(0.05)

    # Against the base arm, at every N: t − base at bo1 per prompt: 0.4−0, 0.3−0.1, 0.2−0, 0.1−0.1 = 0.4, 0.2, 0.2, 0.
    # t's two seeds count (seed means 0.175, 0.325); the base arm is one run and adds no seed level.
    vs_base = {row["N"]: row for row in csv.DictReader(open(out / "vs_base.csv"))}
    assert list(vs_base) == ["1", "2", "4"]
    got = [float(vs_base["1"][f"t − base{k}"]) for k in ("", " lo", " hi")]
    assert got == pytest.approx(seed_prompt_bootstrap(at(TEA, 0), at(BASE, 0), [0, 1], None, RESAMPLES, SEED))
    prompt_only = bootstrap(np.array([0.4, 0.2, 0.2, 0.0]))
    assert got[0] == pytest.approx(0.2) and got[1] < prompt_only[1] and got[2] > prompt_only[2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runs"]["t"]["mean_ci"][0] == pytest.approx(list(seed_prompt_bootstrap(at(TEA, 0), None, [0, 1], None, RESAMPLES, SEED)[1:]))
    assert float(vs_base["4"]["g − base"]) == pytest.approx(np.mean([0.4 - 0.2, 0.5 - 0.3, 0.2 - 0.1, 0.3 - 0.1]))
    assert [int(wtl["g vs g-base"][f"bo4 {k}"]) for k in "WTL"] == [4, 0, 0]

    # Per-seed rows, paired seed by seed: t seed 1 vs g seed 1 at bo4: 0.9−0.5, 0.4−0.4, 0.3−0.2, 0.5−0.4.
    seeds = list(csv.DictReader(open(out / "seeds.csv")))
    # Each seed row is one run: its interval resamples prompts only.
    assert [(r["Method"], r["Seed"], r["Run"], r["Baseline run"]) for r in seeds] == [
        ("g", "0", "g-s0", ""), ("g", "1", "g-s1", ""), ("t", "0", "t-s0", "g-s0"), ("t", "1", "t-s1", "g-s1")]
    t1 = seeds[3]
    assert float(t1["bo4"]) == pytest.approx(np.mean([0.9, 0.4, 0.3, 0.5]))
    assert [float(t1[f"Δbo4 [95% CI]{k}"]) for k in ("", " lo", " hi")] == pytest.approx(bootstrap(np.array([0.4, 0.0, 0.1, 0.1])))

    # Mean length pools every completion of both seeds: g has 10 tokens (seed 0) and 20 (seed 1) → 15.0.
    length = by_method(out / "length.csv")
    assert length["g"]["Mean length"] == "15.0" and int(length["g"]["Source samples"]) == 2 * 4 * M
    assert summary["base_arm"] == "g-base" and summary["runs"]["t"]["baseline"] == "g"
    assert [s["seed"] for s in summary["runs"]["t"]["seeds"]] == [0, 1]
    assert summary["bootstrap"]["levels"] == "seeds-prompts" and summary["bootstrap"]["levels_requested"] == "auto"
    assert summary["bootstrap"]["seed_sets"] == {"g": [0, 1], "t": [0, 1]}
    notes = (out / "report.md").read_text()
    assert "t: 2 seeds pooled (t-s0, t-s1" in notes and "Base arm: g-base" in notes
    assert "Intervals: two-level paired bootstrap (seeds, then prompts), 1000 resamples" in notes
    assert "(--bootstrap-levels auto → seeds-prompts)" in notes
    assert "two-level paired bootstrap (seeds, then prompts) 95% CI" in (out / "endpoints.md").read_text()
    assert "one run each: paired prompt bootstrap 95% CI" in (out / "seeds.md").read_text()


def test_seeds_pool_across_versions_that_write_a_new_key_at_its_default(study, tmp_path):
    """A seed trained before a recipe key existed (its recipe.yaml lacks rollout.stop_tokens) and one trained
    since (the key at its default, []) are the same recipe: one method, as when both are written alike."""
    runs, base = study
    path = runs[3] / "recipe.yaml"  # t-s1
    older = path.read_text().replace("  stop_tokens: []\n", "")
    assert older != path.read_text()
    path.write_text(older)
    res = report(*runs, "--baseline", "g", "--out", tmp_path / "r", "--endpoints", "2,4")
    assert res.exit_code == 0, res.output
    frontier = by_method(tmp_path / "r" / "frontier.csv")
    assert list(frontier) == ["g", "t"] and float(frontier["t"]["bo4"]) == pytest.approx(0.5)
    # a key that differs in value still splits them
    path.write_text(older.replace("group_size: 16", "group_size: 8"))
    res = report(*runs, "--baseline", "g", "--out", tmp_path / "r2", "--endpoints", "2,4")
    assert res.exit_code == 0, res.output
    assert list(by_method(tmp_path / "r2" / "frontier.csv")) == ["g", "t-s0", "t-s1"]


def as_version_1(path: Path, *missing: str) -> None:
    """Rewrite a run's recipe.yaml as tea wrote it before tea_schema was recorded: no `tea_schema` (version 1), without
    the dotted keys `missing` (added since)."""
    tree = yaml.safe_load(path.read_text())
    assert tree.pop(SCHEMA_KEY) == SCHEMA_VERSION
    for key in missing:
        section, leaf = key.split(".")
        del tree[section][leaf]
    path.write_text(yaml.safe_dump(tree, sort_keys=False))


def pin(path: Path, **values) -> None:
    """Set keys ("section__key": value) in a run's recipe.yaml."""
    tree = yaml.safe_load(path.read_text())
    for key, value in values.items():
        section, leaf = key.split("__")
        tree[section][leaf] = value
    path.write_text(yaml.safe_dump(tree, sort_keys=False))


def test_seeds_of_two_schema_versions_pool_when_their_missing_keys_ran_alike(study, tmp_path):
    """t-s1 recorded before tea_schema existed (version 1) lacks keys added since: each counts at its default at version 1
    (schema_default), not today's. Where that equals what t-s0 recorded under this version, one method."""
    runs, base = study
    s0, s1 = runs[2] / "recipe.yaml", runs[3] / "recipe.yaml"
    keys = ("policy.kernels", "rollout.stop_tokens", "advantage.scale_rewards")
    then = {k.replace(".", "__"): schema_default(k, 1) for k in keys}
    pin(s0, **then)  # t-s0 written since, the keys set to what version 1 ran: t-s1's recipe as it ran
    as_version_1(s1, *keys)
    res = report(*runs, "--baseline", "g", "--out", tmp_path / "r", "--endpoints", "2,4")
    assert res.exit_code == 0, res.output
    assert list(by_method(tmp_path / "r" / "frontier.csv")) == ["g", "t"]


def test_seeds_split_by_a_changed_default_are_refused_naming_the_key(study, tmp_path):
    """t-s1 recorded before policy.kernels existed (version 1: it ran without fused kernels) and t-s0 under this version
    at the key's default now: they ran differently, so the report refuses them as one method and says where. Filled in
    at today's default instead, they pooled silently."""
    runs, base = study
    old, now = schema_default("policy.kernels", 1), schema_default("policy.kernels", SCHEMA_VERSION)
    assert old != now == Recipe().policy.kernels
    as_version_1(runs[3] / "recipe.yaml", "policy.kernels")
    res = report(*runs, "--baseline", "g", "--out", tmp_path / "r")
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
    error = " ".join(res.stderr.split())
    assert f"runs {runs[2]} (seed 0) and {runs[3]} (seed 1) are seeds of recipe t written under tea_schema {SCHEMA_VERSION} and 1" in error
    assert f"policy.kernels {now!r} in {runs[2]}, {old!r} in {runs[3]}" in error
    assert not (tmp_path / "r").exists()
    # another key that differs too makes them two recipes, as before: two methods, no error
    pin(runs[3] / "recipe.yaml", rollout__group_size=8)
    res = report(*runs, "--baseline", "g", "--out", tmp_path / "r2")
    assert res.exit_code == 0, res.output
    assert list(by_method(tmp_path / "r2" / "frontier.csv")) == ["g", "t-s0", "t-s1"]


def recorded_under(path: Path, version: int, *missing: str) -> None:
    """Rewrite a run's recipe.yaml as tea_schema `version` wrote it (1: no `tea_schema`) with reward.kernels at its
    default then, without the dotted keys `missing`."""
    tree = yaml.safe_load(path.read_text())
    tree.pop(SCHEMA_KEY)
    if version > 1:
        tree[SCHEMA_KEY] = version
    tree["reward"]["kernels"] = schema_default("reward.kernels", version)
    for key in missing:
        section, leaf = key.split(".")
        del tree[section][leaf]
    path.write_text(yaml.safe_dump(tree, sort_keys=False))


@pytest.mark.parametrize("version, missing", [(2, ()), (1, ("reward.kernels",))])
def test_seeds_of_a_rule_reward_pool_across_the_reward_kernels_default(study, tmp_path, version, missing):
    """reward.kernels' default was eager up to tea_schema 2 and is auto since 3; a rule reward never reads it (kind hf
    only). t-s1 recorded under version 2 with eager, or under version 1 without the key, and t-s0 under this version
    with auto: one method, since the report passes over a key the recipe does not read (config.APPLIES_WHEN)."""
    runs, base = study
    s0, s1 = runs[2] / "recipe.yaml", runs[3] / "recipe.yaml"
    assert (schema_default("reward.kernels", 2), schema_default("reward.kernels", SCHEMA_VERSION)) == ("eager", "auto")
    assert yaml.safe_load(s0.read_text())["reward"]["kind"] == "rule"
    recorded_under(s1, version, *missing)
    assert yaml.safe_load(s1.read_text())["reward"].get("kernels") == (None if missing else "eager")
    res = report(*runs, "--baseline", "g", "--out", tmp_path / "r", "--endpoints", "2,4")
    assert res.exit_code == 0, res.output
    assert list(by_method(tmp_path / "r" / "frontier.csv")) == ["g", "t"]


@pytest.mark.parametrize("version, missing", [(2, ()), (1, ("reward.kernels",))])
def test_seeds_of_an_hf_reward_scored_with_other_kernels_are_refused(study, tmp_path, version, missing):
    """The same pair with an hf reward model, which reads reward.kernels: t-s1 scored eager (recorded, or the default
    of its version), t-s0 auto; they ran differently, and the report refuses them as one method naming the key."""
    runs, base = study
    s0, s1 = runs[2] / "recipe.yaml", runs[3] / "recipe.yaml"
    for path in (s0, s1):
        pin(path, reward__kind="hf", reward__name_or_path="some/rm")
    recorded_under(s1, version, *missing)
    res = report(*runs, "--baseline", "g", "--out", tmp_path / "r")
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
    error = " ".join(res.stderr.split())
    assert f"are seeds of recipe t written under tea_schema {SCHEMA_VERSION} and {version}" in error
    assert f"reward.kernels 'auto' in {runs[2]}, 'eager' in {runs[3]}" in error and "policy.kernels" not in error


def test_a_recipe_yaml_of_a_newer_schema_is_refused_naming_it(study, tmp_path):
    runs, base = study
    tree = yaml.safe_load((runs[3] / "recipe.yaml").read_text())
    tree[SCHEMA_KEY] = SCHEMA_VERSION + 1
    (runs[3] / "recipe.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    res = report(*runs, "--out", tmp_path / "r")
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
    assert (f"{runs[3] / 'recipe.yaml'}: tea_schema: {SCHEMA_VERSION + 1} was written by a newer tea (this one reads versions "
            f"1 to {SCHEMA_VERSION}); upgrade teacli") in " ".join(res.stderr.split())


def test_prompts_level_keeps_the_seed_averaged_prompt_bootstrap(study, tmp_path):
    runs, base = study
    res = report(*runs, "--baseline", "g", "--base-arm", base, "--out", tmp_path / "r", "--bootstrap-levels", "prompts")
    assert res.exit_code == 0, res.output
    out = tmp_path / "r"
    vs_base = {row["N"]: row for row in csv.DictReader(open(out / "vs_base.csv"))}
    assert [float(vs_base["1"][f"t − base{k}"]) for k in ("", " lo", " hi")] == pytest.approx(bootstrap(np.array([0.4, 0.2, 0.2, 0.0])))
    endpoints = by_method(out / "endpoints.csv")
    assert [float(endpoints["t"][k]) for k in ("Δbo2", "Δbo2 lo", "Δbo2 hi")] == pytest.approx(bootstrap(np.array([0.1, 0.0, 0.0, 0.1])))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["bootstrap"]["levels"] == "prompts" and summary["bootstrap"]["levels_requested"] == "prompts"
    notes = (out / "report.md").read_text()
    assert "Intervals: paired prompt bootstrap" in notes and "leave out run-to-run (seed) variance" in notes
    assert "paired prompt bootstrap 95% CI" in (out / "endpoints.md").read_text()


def test_auto_levels_without_seeds_and_a_bad_level(study, tmp_path):
    runs, base = study
    res = report(runs[0], runs[2], "--out", tmp_path / "r")  # one seed per method: auto → prompts
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["bootstrap"]["levels"] == "prompts" and summary["bootstrap"]["seed_sets"] is None
    # Asked for explicitly, seeds-prompts over one-run methods gives the prompt bootstrap's numbers.
    res = report(runs[0], runs[2], "--out", tmp_path / "r2", "--bootstrap-levels", "seeds-prompts")
    assert res.exit_code == 0, res.output
    two = json.loads((tmp_path / "r2" / "summary.json").read_text())
    assert two["bootstrap"]["levels"] == "seeds-prompts" and two["runs"]["t-s0"]["delta"] == summary["runs"]["t-s0"]["delta"]
    res = report(*runs, "--out", tmp_path / "r3", "--bootstrap-levels", "runs")
    assert res.exit_code == 2 and res.stderr.strip() == ("error: --bootstrap-levels 'runs': expected one of auto, prompts, "
                                                         "seeds-prompts")
    assert not (tmp_path / "r3").exists()


def test_unequal_seed_sets_are_resampled_apart(study, tmp_path):
    runs, base = study
    extra = {2: [[0.2, 0.3, 0.4], [0.3, 0.4, 0.5], [0.1, 0.2, 0.3], [0.1, 0.2, 0.3]]}
    g2 = write_run(tmp_path / "runs", "g-s2", "g", 2, extra[2], rule="grpo", tokens=10)
    res = report(*runs, g2, "--baseline", "g", "--out", tmp_path / "r", "--endpoints", "4")
    assert res.exit_code == 0, res.output
    grpo3 = {**GRPO, **extra}
    endpoints = by_method(tmp_path / "r" / "endpoints.csv")
    got = [float(endpoints["t"][k]) for k in ("Δbo4", "Δbo4 lo", "Δbo4 hi")]
    # t has seeds 0, 1 and g 0, 1, 2: no pairing of seeds; each method's own seeds are drawn apart.
    assert got == pytest.approx(seed_prompt_bootstrap(at(TEA, 2), at(grpo3, 2), [0, 1], [0, 1, 2], RESAMPLES, SEED))
    assert got != pytest.approx(seed_prompt_bootstrap(at(TEA, 2), at(grpo3, 2)[:2], [0, 1], [0, 1], RESAMPLES, SEED))
    notes = (tmp_path / "r" / "report.md").read_text()
    assert "Seed sets: g [0, 1, 2]; t [0, 1]." in notes


def test_baseline_and_pairs_name_methods_or_their_runs(study, tmp_path):
    runs, base = study
    for spec in ("g", "g-s1", str(runs[0])):
        res = report(*runs, "--baseline", spec, "--out", tmp_path / "r")
        assert res.exit_code == 0, res.output
        assert "| t vs g |" in (tmp_path / "r" / "win_tie_loss.md").read_text()
    res = report(*runs, "--baseline", "t", "--pair", "g=t", "--out", tmp_path / "r")
    assert res.exit_code == 0 and "| g vs t |" in (tmp_path / "r" / "win_tie_loss.md").read_text()
    # One seed of a recipe: no pooling, the run keeps its directory name, the recipe name still resolves.
    res = report(runs[0], runs[2], "--baseline", "g", "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    assert "| t-s0 vs g-s0 |" in (tmp_path / "r" / "win_tie_loss.md").read_text()
    assert not (tmp_path / "r" / "seeds.md").exists()


def test_same_recipe_and_seed_twice_and_base_arm_as_run_are_errors(study, tmp_path):
    runs, base = study
    twin = write_run(tmp_path / "other", "g-s0-again", "g", 0, GRPO[0], rule="grpo", tokens=10)
    res = report(*runs, twin, "--out", tmp_path / "r")
    assert res.exit_code == 2 and "are the same recipe (g) with the same seed 0" in res.stderr
    res = report(*runs, base, "--base-arm", base, "--out", tmp_path / "r")
    assert res.exit_code == 2 and "also given as a RUN_DIR" in res.stderr
    res = report(*runs[1:], "--base-arm", runs[0], "--out", tmp_path / "r")  # trained, never evaluated as base
    assert res.exit_code == 2 and "g-s0 have no finished evaluation" in res.stderr and "in eval/base/" in res.stderr
    assert not (tmp_path / "r").exists()


def test_watch_table_when_runs_declare_watch_patterns(study, tmp_path):
    """A method whose recipe sets validation.watch_patterns gets the watch table: its seed runs' reward_max
    jump steps and the share of its best-of-N picks (eval/*.best.json.gz) matching the patterns."""
    import gzip

    runs, base = study
    res = report(*runs, "--baseline", "g", "--out", tmp_path / "plain", "--endpoints", "2,4")
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "plain" / "watch.csv").exists()  # no run declared patterns: no table, reports unchanged
    # t-s0: 1 of 4 picks has a "system" line; t-s1: 3 of 4 → the method's share is their mean, 50%.
    # t-s0's reward_max is 1, 2, 1, 2, ... then 9 at step 21 (far above the trailing window): a jump.
    for run, hits in ((runs[2], 1), (runs[3], 3)):
        path = run / "recipe.yaml"
        path.write_text(path.read_text().replace("  watch_patterns: []\n", "  watch_patterns: [^system$]\n"))
        picks = [{"response": "a\nsystem\nb" if i < hits else "a"} for i in range(4)]
        with gzip.open(run / "eval" / f"{SPLIT}-M{M}.best.json.gz", "wt") as f:
            f.write(json.dumps(picks))
        last = 9.0 if run is runs[2] else 2.0
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward_max": float(1 + s % 2)}) + "\n" for s in range(1, 21))
                                           + json.dumps({"step": 21, "reward_max": last}) + "\n")
    res = report(*runs, "--baseline", "g", "--out", tmp_path / "r", "--endpoints", "2,4")
    assert res.exit_code == 0, res.output
    watch = by_method(tmp_path / "r" / "watch.csv")
    assert watch["t"]["Jumps"] == "21; none" and watch["t"]["Flagged"] == "50%"
    assert watch["g"]["Jumps"] == "–; –" and watch["g"]["Flagged"] == "–"
