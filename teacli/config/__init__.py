"""The recipe: one typed tree that says everything a run does, and the settings of the commands around runs.

    tree.py      the Recipe tree: every section, each field declared once (default, documentation, range)
    validate.py  building a YAML tree into it, key by key, and the checks across fields: errors name the key and
                 where its value came from
    load.py      the YAML loader, `base:` inheritance, `--set` overrides; `load_recipe`, `canonical_tree`, `to_yaml`
    schema.py    schema versions (`tea_schema:` in recipe.yaml): the defaults a recorded recipe ran under
    lookup.py    where recipes and studies are found (./recipes, then the packaged ones)
    study.py     a study file's schema (recipes/studies/*.yaml), checked on load
    judge.py     `tea judge`'s settings (JudgeConfig)

A YAML recipe maps 1:1 onto the tree:

    base: [base/ultrafeedback.yaml, base/llama1b.yaml]   # inherited, in order; later wins
    name: uf_llama1b_tea
    advantage: {name: tea, params: {alpha: 0.25, n_target: 128}}

`load_recipe(path, overrides=["optim.lr=3e-5"])` resolves `base:` files (relative to the file that
names them, then ./recipes and the packaged recipes; `quickstart` as a recipe name; `name:` is not inherited), applies
`--set` overrides, and validates: unknown keys, wrong types and out-of-range values raise `RecipeError` naming the
dotted key and the file that set it. Every public name is importable from `teacli.config`.
"""

from teacli.config.judge import DEFAULT_API_KEY_ENV, DEFAULT_BASE_URL, DEFAULT_MODEL, DEFAULT_SPLIT, JudgeConfig, JudgeError
from teacli.config.load import (
    RUN_NAME,
    NAME_RULE,
    apply_overrides,
    canonical_tree,
    load_recipe,
    load_recipe_with_origin,
    parse_override,
    parse_yaml,
    read_yaml,
    recipe_from_dict,
    to_yaml,
)
from teacli.config.lookup import (
    RECIPES_DIR,
    discover_recipes,
    find_recipe,
    find_study,
    packaged_recipes_dir,
    recipe_dirs,
    recipe_summary,
    shipped_studies,
)
from teacli.config.schema import (
    SCHEMA_DEFAULTS,
    SCHEMA_KEY,
    SCHEMA_VERSION,
    default_changes,
    default_differences,
    fill_defaults,
    schema_default,
    schema_version,
)
from teacli.config.study import Study, StudyError, StudyEval, StudyFile, StudyReport, read_study
from teacli.config.tree import (
    APPLIES_WHEN,
    EXECUTION_KEYS,
    JUDGE_KEYS,
    JUDGE_SLOTS,
    JUDGE_TEMPLATE,
    REMOVED_KEYS,
    REMOVED_VALUES,
    VLLM_RESERVED_KWARGS,
    AdvantageConfig,
    BackendConfig,
    CheckpointConfig,
    DataConfig,
    EvalConfig,
    KLConfig,
    LoggingConfig,
    LoraConfig,
    OptimConfig,
    PolicyConfig,
    Recipe,
    RecipeError,
    RehearsalConfig,
    RewardConfig,
    RolloutConfig,
    RuleParams,
    ValidationConfig,
    applicable,
    applies,
    field,
    field_docs,
    flatten,
    is_execution_key,
    judge_template_problem,
    recipe_changes,
)
from teacli.config.validate import OVERRIDE, RECIPE_FILE, build, check_vllm_kwargs, validate_recipe

__all__ = [
    "DEFAULT_API_KEY_ENV", "DEFAULT_BASE_URL", "DEFAULT_MODEL", "DEFAULT_SPLIT", "JudgeConfig", "JudgeError",
    "RUN_NAME", "NAME_RULE", "apply_overrides", "canonical_tree", "load_recipe", "load_recipe_with_origin", "parse_override",
    "parse_yaml", "read_yaml", "recipe_from_dict", "to_yaml",
    "RECIPES_DIR", "discover_recipes", "find_recipe", "find_study", "packaged_recipes_dir", "recipe_dirs", "recipe_summary",
    "shipped_studies",
    "SCHEMA_DEFAULTS", "SCHEMA_KEY", "SCHEMA_VERSION", "default_changes", "default_differences", "fill_defaults", "schema_default", "schema_version",
    "Study", "StudyError", "StudyEval", "StudyFile", "StudyReport", "read_study",
    "APPLIES_WHEN", "EXECUTION_KEYS", "JUDGE_KEYS", "JUDGE_SLOTS", "JUDGE_TEMPLATE", "REMOVED_KEYS", "REMOVED_VALUES", "VLLM_RESERVED_KWARGS",
    "AdvantageConfig", "BackendConfig", "CheckpointConfig", "DataConfig", "EvalConfig", "KLConfig", "LoggingConfig",
    "LoraConfig", "OptimConfig", "PolicyConfig", "Recipe", "RecipeError", "RehearsalConfig", "RewardConfig", "RolloutConfig",
    "RuleParams", "ValidationConfig", "applicable", "applies", "field", "field_docs", "flatten", "is_execution_key", "judge_template_problem",
    "recipe_changes",
    "OVERRIDE", "RECIPE_FILE", "build", "check_vllm_kwargs", "validate_recipe",
]
