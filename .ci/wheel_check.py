"""CI: the installed wheel works on its own, as a user who ran `pip install teacli` would use it.

Run from a directory outside the source tree, with the venv that holds the installed wheel:

    cd "$(mktemp -d)" && python REPO/.ci/wheel_check.py REPO

It checks that `teacli` is imported from site-packages (not the checkout), that every recipe and study
of the repository shipped in the wheel, that `tea recipes validate` passes, that recipe and study names
resolve to the packaged files, and it trains `quickstart` by name for 2 steps on a tiny model built
in-process (tests/tiny_lm.py: transformers and tokenizers only) with the packaged prompt set.
Exit 0 when all of it holds; any failure prints what went wrong and exits 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path


def tea(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("tea")
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        sys.exit(f"wheel check: `tea {' '.join(args)}` exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def main(repo: Path) -> None:
    here = Path.cwd().resolve()
    if here == repo or repo in here.parents:
        sys.exit("wheel check: run it from a directory outside the source tree")

    import teacli
    from teacli.config import find_recipe, find_study, packaged_recipes_dir

    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    installed = Path(teacli.__file__).resolve().parent
    if installed.parent != site:
        sys.exit(f"wheel check: teacli was imported from {installed}, not from {site}")
    packaged = packaged_recipes_dir().resolve()
    assert packaged == installed / "recipes", packaged

    # Every YAML under the repository's recipes/ is in the wheel, byte for byte.
    source = sorted(p.relative_to(repo / "recipes") for p in (repo / "recipes").rglob("*.yaml"))
    shipped = sorted(p.relative_to(packaged) for p in packaged.rglob("*.yaml"))
    if source != shipped:
        sys.exit(f"wheel check: recipes in the wheel differ from recipes/: missing {set(source) - set(shipped)}, extra {set(shipped) - set(source)}")
    changed = [str(p) for p in source if (repo / "recipes" / p).read_bytes() != (packaged / p).read_bytes()]
    assert not changed, changed

    assert find_recipe("quickstart") == packaged / "quickstart.yaml"
    assert find_study("uf_core250") == packaged / "studies" / "uf_core250.yaml"
    print(tea("--version").stdout.strip())
    rows = json.loads(tea("recipes", "list", "--json").stdout)
    n_recipes = len([p for p in source if p.parts[0] not in ("base", "studies")])
    assert len(rows) == n_recipes, (len(rows), n_recipes)
    print(tea("recipes", "validate").stdout.strip().splitlines()[-1])

    # A tiny policy, then `tea train quickstart` by name: the packaged recipe, the packaged prompts.
    sys.path.insert(0, str(repo / "tests"))
    from tiny_lm import make_causal_lm, make_tokenizer, save

    tok = make_tokenizer()
    policy = save(make_causal_lm(tok), tok, here / "policy")
    env = {**os.environ, "TEA_CACHE": str(here / "cache"), "OMP_NUM_THREADS": "1"}
    overrides = {
        "policy.name_or_path": str(policy), "policy.gguf_file": "null", "policy.dtype": "float32",
        "policy.gradient_checkpointing": "false", "data.max_prompt_tokens": "128", "rollout.prompts_per_step": "2",
        "rollout.max_new_tokens": "8", "optim.steps": "2", "optim.micro_batch_size": "32", "checkpoint.save_every": "2",
        "validation.prompts": "4", "validation.samples": "4", "validation.top": "2",
    }
    sets = [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]
    tea("train", "quickstart", *sets, "--run-dir", str(here / "runs" / "quickstart"), env=env)
    run = here / "runs" / "quickstart"
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2], steps
    assert json.loads((run / "selected.json").read_text())["step"] == 2
    assert (run / "checkpoints" / "step_000002" / "config.json").is_file()
    print(f"wheel check: ok ({len(rows)} recipes, quickstart trained 2 steps from the installed wheel)")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
