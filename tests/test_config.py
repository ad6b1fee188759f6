"""The recipe tree: inheritance, overrides, errors naming key and file, every shipped recipe."""

import textwrap
from pathlib import Path

import pytest

from teacli.config import RECIPES_DIR, Recipe, RecipeError, discover_recipes, field_docs, load_recipe, to_yaml


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("path", discover_recipes(), ids=lambda p: p.stem)
def test_every_shipped_recipe_loads(path):
    recipe = load_recipe(path)
    assert recipe.name == path.stem
    assert recipe.policy.name_or_path and recipe.data.dir


def test_every_yaml_under_recipes_parses():
    from teacli.config import read_yaml  # the recipe loader: no duplicate keys, UTF-8

    files = sorted(RECIPES_DIR.rglob("*.yaml"))
    assert len(files) >= 30
    for f in files:
        assert isinstance(read_yaml(f), dict), f


def test_base_inheritance_later_wins_and_overrides(tmp_path):
    write(tmp_path / "a.yaml", "optim: {lr: 1.0e-5, steps: 10}\nrollout: {group_size: 32}\n")
    write(tmp_path / "b.yaml", "optim: {lr: 2.0e-5}\n")
    child = write(
        tmp_path / "child.yaml",
        """\
        base: [a.yaml, b.yaml]
        policy: {name_or_path: x}
        data: {dir: d}
        rollout: {prompts_per_step: 3}
        """,
    )
    r = load_recipe(child, ["optim.steps=7", "advantage.params={alpha: 0.2}", "optim.lr=3e-5"])
    assert r.optim.lr == 3e-5 and r.optim.steps == 7
    assert r.rollout.group_size == 32 and r.rollout.prompts_per_step == 3
    assert r.advantage.params == {"alpha": 0.2}
    assert r.name == "child"


def test_a_recipe_without_a_name_is_named_after_its_own_file_not_its_base(tmp_path, monkeypatch):
    """`base: quickstart.yaml` and no `name:` inherited `name: quickstart`, so the new recipe trained into
    runs/quickstart (over the quickstart run). The name is the recipe's own, else its file's; --set still wins."""
    monkeypatch.chdir(tmp_path)  # no ./recipes here: the packaged quickstart
    mine = write(tmp_path / "my_try.yaml", "base: quickstart.yaml\noptim: {steps: 3}\n")
    assert load_recipe(mine).name == "my_try" and load_recipe(mine).optim.steps == 3
    assert load_recipe(mine, ["name=other"]).name == "other"
    write(mine, "base: quickstart.yaml\nname: mine\n")
    assert load_recipe(mine).name == "mine"
    write(tmp_path / "named.yaml", "name: from_base\npolicy: {name_or_path: x}\ndata: {dir: d}\n")
    assert load_recipe(write(tmp_path / "child.yaml", "base: named.yaml\n")).name == "child"


def test_a_base_without_extension_is_found_like_a_recipe_name(tmp_path, monkeypatch):
    """`base: quickstart` was "not found" although `tea train quickstart` finds recipes/quickstart.yaml."""
    from teacli.config import find_recipe

    monkeypatch.chdir(tmp_path)
    child = write(tmp_path / "child.yaml", "base: quickstart\noptim: {steps: 3}\n")
    r = load_recipe(child)
    assert r.name == "child" and r.policy.name_or_path == load_recipe(find_recipe("quickstart")).policy.name_or_path
    write(tmp_path / "frag.yaml", "optim: {steps: 5}\n")  # a fragment beside the file, by its stem
    write(child, "base: [quickstart, frag]\n")
    assert load_recipe(child).optim.steps == 5
    write(child, "base: nosuch\n")
    with pytest.raises(RecipeError, match=r"child.yaml: base recipe 'nosuch' not found"):
        load_recipe(child)


def test_unknown_key_names_key_and_file(tmp_path):
    write(tmp_path / "base.yaml", "optim: {lrr: 1.0}\n")
    child = write(tmp_path / "c.yaml", "base: base.yaml\n")
    with pytest.raises(RecipeError, match=r"unknown recipe key 'optim.lrr' \(set in .*base.yaml\); did you mean 'optim.lr'"):
        load_recipe(child)


def test_wrong_type_and_range_name_key_and_file(tmp_path):
    bad_type = write(tmp_path / "t.yaml", "rollout: {group_size: many}\n")
    with pytest.raises(RecipeError, match=r"rollout.group_size: expected an integer, got 'many' \(set in .*t.yaml\)"):
        load_recipe(bad_type)
    bad_range = write(tmp_path / "r.yaml", "rollout: {top_p: 1.5}\n")
    with pytest.raises(RecipeError, match=r"rollout.top_p: 1.5 is out of range: must be <= 1.0"):
        load_recipe(bad_range)
    bad_choice = write(tmp_path / "l.yaml", "kl: {estimator: k9}\n")
    with pytest.raises(RecipeError, match=r"kl.estimator: 'k9' is not one of 'k2', 'k1_penalty', 'grpo_k3'"):
        load_recipe(bad_choice)


def test_advantage_rule_checked_against_group_size(tmp_path):
    p = write(tmp_path / "p.yaml", "advantage: {name: prefix_tea, params: {}}\nrollout: {group_size: 16}\n")
    with pytest.raises(RecipeError, match=r"no valid prefix plan for group size m=16.*smallest valid m is 24.*p.yaml"):
        load_recipe(p)
    q = write(tmp_path / "q.yaml", "advantage: {name: grpo, params: {alpha: 0.3}}\n")
    with pytest.raises(RecipeError, match=r"'grpo' does not take parameter\(s\) alpha"):
        load_recipe(q)


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_recipe(tmp_path / "nope.yaml")
    with pytest.raises(RecipeError, match="expected KEY=VALUE"):
        load_recipe(write(tmp_path / "ok.yaml", "seed: 1\n"), ["optim.lr"])
    child = write(tmp_path / "loop.yaml", "base: loop.yaml\n")
    with pytest.raises(RecipeError, match="circular"):
        load_recipe(child)


def test_resolved_yaml_round_trips(tmp_path):
    r = load_recipe(RECIPES_DIR / "uf_llama1b_prefix_tea.yaml")
    dumped = write(tmp_path / "resolved.yaml", to_yaml(r))
    assert load_recipe(dumped) == r


def test_every_field_is_documented():
    rows = field_docs(Recipe)
    assert len(rows) > 50
    undocumented = [key for key, _, _, doc in rows if not doc]
    assert undocumented == []


def test_docs_list_every_recipe_field():
    text = (RECIPES_DIR.parent / "docs" / "recipes.md").read_text()
    missing = [key for key, _, _, _ in field_docs(Recipe) if f"`{key}`" not in text]
    assert missing == []


# ------------------------------------------------------------------------------------------------
# Bad input is a RecipeError naming the key and the file, never a silent wrong value (issue 14)

RUNNABLE = "policy: {name_or_path: p}\ndata: {dir: d}\n"


def test_duplicate_keys_name_the_key_the_line_and_the_file(tmp_path):
    dup = write(tmp_path / "dup.yaml", RUNNABLE + "optim:\n  lr: 2.0e-5\noptim:\n  steps: 3\n")
    with pytest.raises(RecipeError, match=r"dup.yaml:5: duplicate key 'optim' \(first at line 3\)"):
        load_recipe(dup)
    nested = write(tmp_path / "nested.yaml", RUNNABLE + "rollout:\n  group_size: 8\n  top_k: 5\n  group_size: 16\n")
    with pytest.raises(RecipeError, match=r"nested.yaml:6: duplicate key 'group_size'"):
        load_recipe(nested)
    write(tmp_path / "base.yaml", "seed: 1\nseed: 2\n")
    with pytest.raises(RecipeError, match=r"base.yaml:2: duplicate key 'seed'"):
        load_recipe(write(tmp_path / "child.yaml", "base: base.yaml\n" + RUNNABLE))
    with pytest.raises(RecipeError, match=r"--set .*duplicate key 'alpha'"):
        load_recipe(write(tmp_path / "ok.yaml", RUNNABLE), ["advantage.params={alpha: 0.2, alpha: 0.3}"])
    # A YAML merge key is an override by design, not a duplicate.
    merged = write(tmp_path / "merged.yaml", RUNNABLE + "optim: {<<: {steps: 3, lr: 2.0e-5}, steps: 5}\n")
    assert load_recipe(merged).optim.steps == 5 and load_recipe(merged).optim.lr == 2.0e-5


@pytest.mark.parametrize("text, value", [("1e-5", 1e-5), ("2E-5", 2e-5), ("3e+4", 3e4), (".5e-3", 5e-4), ("1.0e-5", 1e-5)])
def test_numbers_with_an_exponent_read_as_users_write_them(tmp_path, text, value):
    p = write(tmp_path / "r.yaml", RUNNABLE + f"optim: {{lr: {text}}}\n")
    assert load_recipe(p).optim.lr == value
    assert load_recipe(write(tmp_path / "s.yaml", RUNNABLE), [f"optim.lr={text}"]).optim.lr == value


def test_empty_and_unrunnable_recipes_are_errors(tmp_path):
    with pytest.raises(RecipeError, match=r"empty.yaml is empty"):
        load_recipe(write(tmp_path / "empty.yaml", ""))
    with pytest.raises(RecipeError, match=r"comments.yaml is empty"):
        load_recipe(write(tmp_path / "comments.yaml", "# nothing here\n\n"))
    with pytest.raises(RecipeError, match=r"policy.name_or_path: required.*\(not set in .*seed.yaml or its bases\)"):
        load_recipe(write(tmp_path / "seed.yaml", "seed: 1\n"))
    with pytest.raises(RecipeError, match=r"data.dir: required.*builtin.*not set in .*nodata.yaml"):
        load_recipe(write(tmp_path / "nodata.yaml", "policy: {name_or_path: p}\n"))
    with pytest.raises(RecipeError, match=r"policy.name_or_path: required.*\(set by --set\)"):
        load_recipe(write(tmp_path / "ok.yaml", RUNNABLE), ["policy.name_or_path="])


@pytest.mark.parametrize(
    "text, override, message",
    [
        ("optim: {lr: .inf}", None, r"optim.lr: expected a finite number, got inf \(set in .*r.yaml\)"),
        ("optim: {lr: .nan}", None, r"optim.lr: expected a finite number, got nan"),
        ("", "optim.lr=inf", r"optim.lr: expected a number, got 'inf' \(set by --set\)"),
        ("", "optim.lr=.inf", r"optim.lr: expected a finite number, got inf \(set by --set\)"),
        ("optim: {betas: [0.9, .nan]}", None, r"optim.betas\[1\]: expected a finite number"),
        ("optim: {steps: .inf}", None, r"optim.steps: expected an integer, got inf"),
        ("name: 1e5", None, r"name: expected a string, got 100000.0 \(quote it to mean text\)"),
    ],
)
def test_non_finite_and_mistyped_numbers_are_refused(tmp_path, text, override, message):
    p = write(tmp_path / "r.yaml", RUNNABLE + text + "\n")
    with pytest.raises(RecipeError, match=message):
        load_recipe(p, [override] if override else [])


@pytest.mark.parametrize(
    "params, message",
    [
        ("{tolerance: -1}", r"reward.params.tolerance: -1.0 is out of range: must be > 0.0 \(set in .*r.yaml\)"),
        ("{tolerance: 0}", r"reward.params.tolerance: 0.0 is out of range"),
        ("{tie_break: 1.0}", r"reward.params.tie_break: 1.0 is out of range: must be < 1.0"),
        ("{tolerance: .inf}", r"reward.params.tolerance: expected a finite number"),
        ("{tolerence: 0.3}", r"unknown recipe key 'reward.params.tolerence' \(set in .*r.yaml\); did you mean 'reward.params.tolerance'"),
        ("{scale: 2}", r"unknown recipe key 'reward.params.scale'.*valid keys under reward.params: tolerance, tie_break"),
    ],
)
def test_rule_reward_params_are_checked_against_the_reward(tmp_path, params, message):
    p = write(tmp_path / "r.yaml", RUNNABLE + f"reward: {{kind: rule, params: {params}}}\n")
    with pytest.raises(RecipeError, match=message):
        load_recipe(p)


def test_python_reward_params_are_checked_against_its_signature(tmp_path, monkeypatch):
    (tmp_path / "user_rewards.py").write_text(textwrap.dedent("""\
        def scaled(prompts, responses, scale=1.0, *, offset):
            return [scale * len(r) + offset for r in responses]
        def anything(prompts, responses, **params):
            return [0.0 for r in responses]
        class Judge:
            def __init__(self, bonus=0.0):
                self.bonus = bonus
            def score(self, prompts, responses):
                return [self.bonus for r in responses]
        """))
    monkeypatch.syspath_prepend(str(tmp_path))

    def recipe(function, params):
        return write(tmp_path / "r.yaml", RUNNABLE + f"reward: {{kind: python, function: '{function}', params: {params}}}\n")

    assert load_recipe(recipe("user_rewards:scaled", "{scale: 2, offset: 1}")).reward.params == {"scale": 2, "offset": 1}
    assert load_recipe(recipe("user_rewards:anything", "{whatever: 1}")).reward.params == {"whatever": 1}
    assert load_recipe(recipe("user_rewards:Judge", "{bonus: 0.5}")).reward.params == {"bonus": 0.5}
    with pytest.raises(RecipeError, match=r"reward.params.scal: user_rewards:scaled takes no parameter 'scal' \(set in .*r.yaml\); did you mean 'reward.params.scale'"):
        load_recipe(recipe("user_rewards:scaled", "{scal: 2, offset: 1}"))
    with pytest.raises(RecipeError, match=r"reward.params: user_rewards:scaled cannot be called with them: .*offset"):
        load_recipe(recipe("user_rewards:scaled", "{scale: 2}"))
    with pytest.raises(RecipeError, match=r"reward.params.margin: user_rewards:Judge takes no parameter 'margin'.*it accepts: bonus"):
        load_recipe(recipe("user_rewards:Judge", "{margin: 1}"))
    with pytest.raises(RecipeError, match=r"reward.function: module 'user_rewards' has no function or class 'nope'"):
        load_recipe(recipe("user_rewards:nope", "{}"))
    with pytest.raises(RecipeError, match=r"reward.params: kind 'hf' takes no parameters, got scale"):
        load_recipe(write(tmp_path / "hf.yaml", RUNNABLE + "reward: {kind: hf, name_or_path: rm, params: {scale: 1}}\n"))


# -- rollout.vllm_kwargs: free vllm.LLM arguments (issue 19) -----------------------------------------


def test_vllm_kwargs_parse_and_are_replaced_whole_not_merged(tmp_path):
    write(tmp_path / "base.yaml", RUNNABLE + "rollout:\n  engine: vllm\n  vllm_kwargs: {async_scheduling: true, max_num_seqs: 32}\n")
    child = write(tmp_path / "child.yaml", "base: base.yaml\nrollout: {vllm_kwargs: {max_num_batched_tokens: 8192}}\n")
    assert load_recipe(tmp_path / "base.yaml").rollout.vllm_kwargs == {"async_scheduling": True, "max_num_seqs": 32}
    assert Recipe().rollout.vllm_kwargs == {}
    assert load_recipe(child).rollout.vllm_kwargs == {"max_num_batched_tokens": 8192}  # the base's two keys are gone
    base = tmp_path / "base.yaml"
    assert load_recipe(base, ["rollout.vllm_kwargs={max_num_seqs: 64}"]).rollout.vllm_kwargs == {"max_num_seqs": 64}
    assert load_recipe(base, ["rollout={vllm_kwargs: {max_num_seqs: 64}}"]).rollout.vllm_kwargs == {"max_num_seqs": 64}
    assert load_recipe(base, ['rollout.vllm_kwargs={"compilation_config": {"cudagraph_capture_sizes": [1, 8]}}']).rollout.vllm_kwargs == {
        "compilation_config": {"cudagraph_capture_sizes": [1, 8]}}
    # A dotted key sets that one argument; {} clears them all.
    assert load_recipe(base, ["rollout.vllm_kwargs.max_num_seqs=16"]).rollout.vllm_kwargs == {"async_scheduling": True, "max_num_seqs": 16}
    assert load_recipe(base, ["rollout.vllm_kwargs={}"]).rollout.vllm_kwargs == {}
    resolved = write(tmp_path / "resolved.yaml", to_yaml(load_recipe(child)))  # as written beside a checkpoint
    assert load_recipe(resolved).rollout.vllm_kwargs == {"max_num_batched_tokens": 8192}
    with pytest.raises(RecipeError, match=r"rollout.vllm_kwargs: expected a mapping, got 'fast' \(set by --set\)"):
        load_recipe(base, ["rollout.vllm_kwargs=fast"])
    with pytest.raises(RecipeError, match=r"rollout.vllm_kwargs: 1 is not an argument name \(set by --set\)"):
        load_recipe(base, ["rollout.vllm_kwargs={1: 2}"])


@pytest.mark.parametrize(
    "key, instead",
    [
        ("gpu_memory_utilization", "set rollout.gpu_memory_utilization"),
        ("kv_cache_memory_bytes", "set rollout.kv_cache_gib"),
        ("enforce_eager", r"set rollout.compile \(false = enforce_eager\)"),
        ("enable_sleep_mode", "set rollout.sleep"),
        ("dtype", "set policy.dtype"),
        ("seed", r"set seed \("),
        ("max_model_len", r"it is data.max_prompt_tokens \+ rollout.max_new_tokens"),
        ("logprobs_mode", "the sync check and rollout.is_correction need the raw log-probs"),
        ("enable_prefix_caching", "always on, and reset after every weight push"),
    ],
)
def test_vllm_kwargs_that_tea_sets_itself_are_refused_naming_the_key(tmp_path, key, instead):
    p = write(tmp_path / "r.yaml", RUNNABLE + f"rollout: {{engine: vllm, vllm_kwargs: {{max_num_seqs: 8, {key}: 1}}}}\n")
    with pytest.raises(RecipeError, match=rf"^rollout.vllm_kwargs.{key}: tea sets vLLM's {key} itself \(set in .*r.yaml\): {instead}"):
        load_recipe(p)
    with pytest.raises(RecipeError, match=rf"^rollout.vllm_kwargs.{key}: tea sets vLLM's {key} itself \(set by --set\): {instead}"):
        load_recipe(write(tmp_path / "ok.yaml", RUNNABLE), [f"rollout.vllm_kwargs={{{key}: 1}}"])


def test_every_reserved_vllm_kwarg_says_what_to_do_instead():
    from teacli.config import VLLM_RESERVED_KWARGS, check_vllm_kwargs

    assert {"model", "tokenizer", "load_format", "tensor_parallel_size", "distributed_executor_backend", "generation_config",
            "trust_remote_code"} <= set(VLLM_RESERVED_KWARGS)
    for key, instead in VLLM_RESERVED_KWARGS.items():
        with pytest.raises(RecipeError) as exc:
            check_vllm_kwargs({key: None})
        assert str(exc.value) == f"rollout.vllm_kwargs.{key}: tea sets vLLM's {key} itself: {instead}"
    check_vllm_kwargs({"async_scheduling": True, "max_num_seqs": 64, "disable_log_stats": False})  # not tea's: no error


def test_errors_from_set_say_so_and_name_each_source(tmp_path):
    p = write(tmp_path / "r.yaml", RUNNABLE + "advantage: {name: tea, params: {alpha: 0.25}}\nrollout: {group_size: 16}\n")
    with pytest.raises(RecipeError, match=r"optim.lr: expected a number, got 'abc' \(set by --set\)$"):
        load_recipe(p, ["optim.lr=abc"])
    with pytest.raises(RecipeError, match=r"unknown recipe key 'optim.lrr' \(set by --set\)"):
        load_recipe(p, ["optim.lrr=1"])
    # A cross-field error names where each involved key came from; --set is not blamed on the file.
    with pytest.raises(RecipeError, match=r"alpha must lie in .*\(rollout.group_size, advantage.name set in .*r.yaml; advantage.params set by --set\)"):
        load_recipe(p, ["advantage.params={alpha: 0.7}"])
    with pytest.raises(RecipeError, match=r"validation.top: 10 exceeds validation.samples=4 \(validation.samples set by --set\)"):
        load_recipe(p, ["validation.samples=4"])


def test_files_that_cannot_be_read_are_one_line_errors(tmp_path):
    (tmp_path / "adir").mkdir()
    with pytest.raises(RecipeError, match=r"adir is a directory, not a YAML file"):
        load_recipe(tmp_path / "adir")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"seed: 1\ndescription: caf\xe9\n")
    with pytest.raises(RecipeError, match=r"latin.yaml:2: not UTF-8 text \(byte 0xe9\)"):
        load_recipe(latin)
    with pytest.raises(RecipeError, match=r"bad.yaml:2: not valid YAML: mapping values are not allowed here") as exc:
        load_recipe(write(tmp_path / "bad.yaml", "seed: 1\noptim: lr: 1\n"))
    assert "\n" not in str(exc.value)
    with pytest.raises(RecipeError, match=r"list.yaml: a recipe must be a YAML mapping"):
        load_recipe(write(tmp_path / "list.yaml", "- 1\n- 2\n"))


def test_names_resolve_against_local_recipes_first_then_the_packaged_ones(tmp_path, monkeypatch):
    from teacli.config import find_recipe, find_study, packaged_recipes_dir

    packaged = packaged_recipes_dir()
    monkeypatch.chdir(tmp_path)  # no ./recipes here: the packaged recipes
    assert find_recipe("quickstart") == packaged / "quickstart.yaml"
    assert find_study("uf_core250") == packaged / "studies" / "uf_core250.yaml"
    with pytest.raises(RecipeError, match=r"recipe file not found: recipes/uf_llama1b_tea.yaml; the recipe name 'uf_llama1b_tea' finds"):
        find_recipe("recipes/uf_llama1b_tea.yaml")
    with pytest.raises(RecipeError, match=r"no recipe file or name 'nope'"):
        find_recipe("nope")
    (tmp_path / "somedir").mkdir()
    with pytest.raises(RecipeError, match=r"somedir is a directory, not a recipe file"):
        find_recipe("somedir")

    local = tmp_path / "recipes"
    (local / "studies").mkdir(parents=True)
    write(local / "quickstart.yaml", "base: base/llama1b.yaml\nname: quickstart\ndata: {dir: builtin}\n")  # base: packaged
    write(local / "mine.yaml", RUNNABLE)
    write(local / "studies" / "uf_core250.yaml", "recipes: [mine]\n")
    assert find_recipe("quickstart") == local / "quickstart.yaml"
    assert find_recipe("uf_llama1b_tea") == packaged / "uf_llama1b_tea.yaml"
    assert find_study("uf_core250") == local / "studies" / "uf_core250.yaml"
    found = {p.stem: p for p in discover_recipes()}
    assert found["quickstart"].parent == local and found["mine"].parent == local
    assert found["uf_llama1b_tea"].parent == packaged and len(found) == len(discover_recipes(packaged)) + 1
    assert load_recipe(find_recipe("quickstart")).policy.name_or_path == "meta-llama/Llama-3.2-1B-Instruct"


def test_execution_keys_are_told_apart_from_what_defines_the_experiment():
    """recipe_changes lists every differing leaf; is_execution_key says which of them a resume may take."""
    import copy

    from teacli.config import is_execution_key, recipe_changes

    old = Recipe().to_dict()
    new = copy.deepcopy(old)
    new["rollout"]["batch_size"] = 8
    new["optim"]["lr"] = 1.0
    new["logging"]["report_to"] = ["wandb"]
    new["advantage"]["params"] = {"alpha": 0.5}
    changes = recipe_changes(old, new)
    assert changes == {
        "rollout.batch_size": (64, 8), "optim.lr": (1e-5, 1.0), "logging.report_to": (None, ["wandb"]),
        "advantage.params.alpha": (None, 0.5), "advantage.params": ({}, None),
    }
    assert [k for k in changes if is_execution_key(k)] == ["rollout.batch_size", "logging.report_to"]
    assert recipe_changes(old, copy.deepcopy(old)) == {}
    for key in ("optim.steps", "optim.micro_batch_size", "policy.gradient_checkpointing", "rollout.kv_cache_gib", "logging.project",
                "rollout.vllm_kwargs", "rollout.vllm_kwargs.max_num_seqs"):
        assert is_execution_key(key), key
    for key in ("rollout.batch_sizes", "log", "optim.lr", "rollout.group_size", "data.dir", "policy.name_or_path"):
        assert not is_execution_key(key), key


def test_a_key_the_recipe_does_not_read_is_no_change():
    """APPLIES_WHEN names each reward key with the kinds that read it: recipe_changes (resume, a base arm, a study's
    trained runs, the report's seeds) passes over a key that either recipe does not read, and applicable drops it; a
    key both read still differs, and a tree without the deciding key counts the key as read."""
    import copy
    import typing

    from teacli.config import APPLIES_WHEN, RewardConfig, applicable, applies, recipe_changes

    keys = {key for key, _, _, _ in field_docs(Recipe)}
    kinds = typing.get_args(typing.get_type_hints(RewardConfig)["kind"])
    for key, (decider, values) in APPLIES_WHEN.items():
        assert key in keys and decider in keys and set(values) <= set(kinds), key
    # a reward key added must say which kinds read it (a key every kind reads: leave it out here)
    assert {k for k in keys if k.startswith("reward.")} - set(APPLIES_WHEN) == {"reward.kind"}

    rule = Recipe().to_dict()
    assert rule["reward"]["kind"] == "rule"
    other = copy.deepcopy(rule)
    other["reward"].update(kernels="eager", share_prompts=False, batch_size=3, url="http://x", judge_template="{prompt}")
    assert recipe_changes(rule, other) == {}
    other["reward"]["params"] = {"tolerance": 1.0}  # the rule reads its params
    assert recipe_changes(rule, other) == {"reward.params.tolerance": (None, 1.0), "reward.params": ({}, None)}
    hf = copy.deepcopy(rule)
    hf["reward"].update(kind="hf", name_or_path="rm")
    eager = copy.deepcopy(hf)
    eager["reward"]["kernels"] = "eager"
    assert recipe_changes(hf, eager) == {"reward.kernels": ("auto", "eager")}
    assert recipe_changes(rule, eager) == {"reward.kind": ("rule", "hf")}  # what only one of them reads is no change
    assert "kernels" not in applicable(rule)["reward"] and applicable(hf)["reward"]["kernels"] == "auto"
    assert rule["reward"]["kernels"] == "auto" and "params" not in applicable(hf)["reward"]  # a copy
    assert applies("reward.kernels", {"reward": {}}) and applies("optim.lr", rule) and not applies("reward.params.tolerance", hf)


def test_canonical_tree_fills_keys_an_older_recipe_yaml_lacks():
    """A run's recipe.yaml written before a key existed compares equal, through canonical_tree, to one written
    since with the key at its default; a differing value still differs; a tree that does not build is None."""
    import copy

    from teacli.config import canonical_tree, parse_yaml, to_yaml

    now = parse_yaml(to_yaml(Recipe()), "now")
    older = copy.deepcopy(now)
    assert older["rollout"].pop("stop_tokens") == [] and older != now
    assert canonical_tree(older) == canonical_tree(now) == now
    older["rollout"]["group_size"] = 8
    assert canonical_tree(older) != now and canonical_tree(older)["rollout"]["group_size"] == 8
    assert canonical_tree({"rollout": {"no_such_key": 1}}) is None
    assert canonical_tree({"rollout": {"group_size": "many"}}) is None
    assert canonical_tree("not a mapping") is None

# -- `--set` (issue 22: items 4 and 13) --------------------------------------------------------------


def test_set_with_a_mapping_merges_into_the_section(tmp_path):
    """`--set 'rollout={temperature: 0.7}'` changes that key and keeps the recipe's other rollout keys
    (before: the whole section was replaced, so they fell back to the defaults)."""
    p = write(tmp_path / "r.yaml", RUNNABLE + "rollout: {prompts_per_step: 4, group_size: 16, max_new_tokens: 48}\n"
              "advantage: {name: tea, params: {alpha: 0.25, n_target: 64}}\n")
    r = load_recipe(p, ["rollout={temperature: 0.7}"])
    assert (r.rollout.temperature, r.rollout.prompts_per_step, r.rollout.group_size, r.rollout.max_new_tokens) == (0.7, 4, 16, 48)
    # Free-form parameters are replaced whole, as when a recipe overrides its base.
    assert load_recipe(p, ["advantage.params={alpha: 0.4}"]).advantage.params == {"alpha": 0.4}
    # Errors inside a merged mapping are blamed on --set; the recipe's own keys stay the file's.
    with pytest.raises(RecipeError, match=r"unknown recipe key 'rollout.temprature' \(set by --set\)"):
        load_recipe(p, ["rollout={temprature: 0.7}"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("rollout.foo.bar=1", r"unknown recipe key 'rollout.foo' \(set by --set\)"),
        ("optim.betas=[0.9, x]", r"optim.betas\[1\]: expected a number, got 'x' \(set by --set\)"),
        ("logging.report_to=[nope]", r"logging.report_to\[0\]: 'nope' is not one of .*\(set by --set\)"),
        ("optim.steps=0x10", r"optim.steps: expected an integer, got '0x10' \(set by --set\)"),
        ("optim.steps=010", r"optim.steps: expected an integer, got '010' \(set by --set\)"),
        ("optim.steps=1:30", r"optim.steps: expected an integer, got '1:30' \(set by --set\)"),
        ("name=", r"name: empty \(set by --set\); give the run a name, or leave name out to use the file's \('r'\)"),
        ("name=''", r"name: empty \(set by --set\)"),
    ],
)
def test_set_errors_name_set(tmp_path, override, message):
    p = write(tmp_path / "r.yaml", RUNNABLE + "optim: {steps: 8}\nlogging: {report_to: []}\n")
    with pytest.raises(RecipeError, match=message):
        load_recipe(p, [override])


def test_only_decimal_numbers_are_numbers(tmp_path):
    """YAML 1.1's hex, octal and base-60 ints would turn a typo into another number; in a file too."""
    p = write(tmp_path / "r.yaml", RUNNABLE + "optim: {steps: 0x10}\n")
    with pytest.raises(RecipeError, match=r"optim.steps: expected an integer, got '0x10' \(set in .*r.yaml\)"):
        load_recipe(p)
    assert load_recipe(p, ["optim.steps=1_000"]).optim.steps == 1000
    assert load_recipe(p, ["optim.steps=+16", "optim.lr=.5e-3"]).optim.lr == 5e-4


def test_rollout_kv_cache_gib_takes_null_a_size_or_auto(tmp_path):
    from teacli.config import RecipeError, load_recipe

    path = tmp_path / "r.yaml"
    path.write_text("policy: {name_or_path: p}\ndata: {dir: d}\n")
    assert load_recipe(path).rollout.kv_cache_gib is None  # vLLM sizes it from the share
    assert load_recipe(path, ["rollout.kv_cache_gib=auto"]).rollout.kv_cache_gib == "auto"
    assert load_recipe(path, ["rollout.kv_cache_gib=4"]).rollout.kv_cache_gib == 4.0
    with pytest.raises(RecipeError, match=r"^rollout.kv_cache_gib: 0.0 is out of range"):
        load_recipe(path, ["rollout.kv_cache_gib=0"])
    with pytest.raises(RecipeError, match=r"^rollout.kv_cache_gib: 'big' has the wrong type"):
        load_recipe(path, ["rollout.kv_cache_gib=big"])


@pytest.mark.parametrize(
    "text, override, message",
    [
        ("advantage: {name: tea, params: {1: 2}}", None, r"advantage.params: 1 is not an argument name \(set in .*r.yaml\)"),
        ("", "advantage.params={1: 2}", r"advantage.params: 1 is not an argument name \(set by --set\)"),
        ("reward: {kind: rule, params: {2: x}}", None, r"reward.params: 2 is not an argument name"),
        ("advantage: {name: tea, params: {n_target: .inf}}", None,
         r"advantage.params.n_target: expected a finite number, got inf \(set in .*r.yaml\)"),
        ("advantage: {name: tea, params: {alpha: .nan}}", None, r"advantage.params.alpha: expected a finite number, got nan"),
        ("seed: 18446744073709551617", None, r"seed: 18446744073709551617 is out of range: must be <= 4294967295 \(set in .*r.yaml\)"),
        ("", "seed=4294967296", r"seed: 4294967296 is out of range: must be <= 4294967295 \(set by --set\)"),
    ],
)
def test_parameter_keys_infinite_parameters_and_huge_seeds_are_one_line_errors(tmp_path, text, override, message):
    # Before: a TypeError traceback from joining the int key, an OverflowError from int(inf) (also in
    # `tea recipes validate`), and "Overflow when unpacking long long" once training seeded torch.
    p = write(tmp_path / "r.yaml", RUNNABLE + "rollout: {group_size: 8}\n" + text + "\n")
    with pytest.raises(RecipeError, match=message):
        load_recipe(p, [override] if override else [])


def test_the_largest_seed_loads(tmp_path):
    p = write(tmp_path / "r.yaml", RUNNABLE + "seed: 4294967295\n")
    assert load_recipe(p, advantage=False).seed == 2**32 - 1


@pytest.mark.parametrize("name", ["../../etc/x", "a/b", "/abs/path", "..", ".hidden", "-x", "a b", "a\\\\b"])
@pytest.mark.parametrize("how", ["file", "set"])
def test_a_run_name_is_a_name_not_a_path(tmp_path, name, how):
    # The name becomes runs/<name>: `../../etc/x` wrote the run outside runs/, `a/b` nested, `/abs/path` was accepted.
    text, overrides = (RUNNABLE + f"name: {name!r}\n", []) if how == "file" else (RUNNABLE, [f"name={name}"])
    p = write(tmp_path / "r.yaml", text)
    where = r"\(set by --set\)" if how == "set" else r"\(set in .*r.yaml\)"
    with pytest.raises(RecipeError, match=rf"^name: .* is not a run name \(letters, digits, '_', '.' and '-', .*\) {where}$"):
        load_recipe(p, overrides, advantage=False)


def test_run_names_and_file_names_that_are_names_load(tmp_path):
    assert load_recipe(write(tmp_path / "r.yaml", RUNNABLE + "name: uf_llama1b-tea.v2\n"), advantage=False).name == "uf_llama1b-tea.v2"
    assert load_recipe(write(tmp_path / "my_recipe-s0.yaml", RUNNABLE), advantage=False).name == "my_recipe-s0"
    with pytest.raises(RecipeError, match=r"name: not set in .*my recipe.yaml, and its file name 'my recipe' is not a run name"):
        load_recipe(write(tmp_path / "my recipe.yaml", RUNNABLE), advantage=False)


@pytest.mark.parametrize("code, message", [("import sys\nsys.exit(0)\n", "SystemExit: 0"), ("x = {}['k']\n", "KeyError: 'k'")])
def test_a_reward_module_that_fails_on_import_is_a_recipe_error(tmp_path, monkeypatch, code, message):
    # Before: the SystemExit ended `tea recipes show` with exit 0 and no output; the KeyError was a traceback.
    (tmp_path / "import_fails.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    p = write(tmp_path / "r.yaml", RUNNABLE + "reward: {kind: python, function: 'import_fails:f'}\n")
    with pytest.raises(RecipeError, match=rf"^reward.function: importing module 'import_fails' of 'import_fails:f' raised "
                                          rf"{message} \(set in .*r.yaml\)$"):
        load_recipe(p, advantage=False)
