"""The import rule (docs/architecture.md): each folder imports only downward, nothing imports in a
circle, and deepspeed and vllm each have exactly one importer.

The graph is read from the source with `ast` (module-level and function-level imports alike; imports
under `if TYPE_CHECKING:` are annotations only and are skipped), so a lazy import cannot hide an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "teacli"

# unit → the units it may import. A unit is a folder of teacli/ or a top-level module. Every unit may import
# the units listed for it and nothing else: there are no exceptions for single modules.
ALLOWED: dict[str, set[str]] = {
    # leaves: below every stage
    "types": set(),
    "rundir": set(),
    "cache": set(),  # tea's cache directory: the one reader of TEA_CACHE
    "logprobs": set(),
    "kernels": set(),
    "advantages": set(),
    "memory": set(),  # byte arithmetic of states, activations, KV caches: the planner, the trainer, the vllm engine
    "http": set(),  # the remote reward's and the judge's retry, Retry-After and local-host rules
    "tables": set(),  # the Markdown/LaTeX/CSV table writer of report/ and diagnostics/
    "padding": set(),  # cutting length-sorted rows into batches with the least padding: the trainer's and the reward model's
    "console": {"cache"},  # what every command shows on the terminal: help, one-line errors (a path in TEA_CACHE), progress
    "monitors": {"rundir"},  # the reward-hacking watch and the tail check: train/ and report/ both use them
    "data": {"types", "cache"},  # cache: the packaged prompt sets are prepared there
    "config": {"advantages", "rundir"},  # validating advantage.name runs the rule once (an importlib import); rundir: a study's eval.checkpoint
    "models": {"config", "logprobs", "cache"},  # cache: converted pypi: models  # sdpa_gqa uses the NaN-safe mask of the log-prob forward
    "lora": {"config"},
    "standins": {"config", "models"},  # a rehearsal's stand-ins: model configs, tokenizer and prompts; model sizes
    # stages
    "rewards": {"config", "types", "models", "kernels", "http", "logprobs", "padding"},  # kernels: reward.kernels, as policy.kernels; logprobs: the prompt cache (reward.share_prompts); padding: the forward batches' cut
    "rollout": {"config", "types", "models", "logprobs", "kernels", "lora", "standins", "memory"},  # standins: the policy's size for engine auto  # kernels: the hf engine keeps liger out of generation
    "session": {"config", "types", "models", "logprobs", "kernels", "lora", "standins", "rewards", "rollout", "data"},
    "train": {"config", "types", "models", "logprobs", "kernels", "lora", "rewards", "rollout", "advantages", "data", "rundir",
              "standins", "memory", "monitors", "session", "padding"},
    "eval": {"config", "types", "models", "rewards", "rollout", "data", "rundir", "standins", "session", "http"},
    # readers of what the stages wrote, and the tools on top
    "report": {"eval", "rundir", "monitors", "tables", "config"},  # eval: its stats.py; config: seeds of one method compare as the schema resolves them
    "diagnostics": {"advantages", "config", "types", "models", "logprobs", "rewards", "rollout", "data", "rundir", "eval", "session", "tables"},
    "study": {"config", "rundir", "data", "eval"},  # eval: the N an evaluation reports and the bootstrap's bounds (eval/stats.py)
    "planner": {"config", "standins", "memory", "rollout", "data", "padding"},  # rollout: engine auto's rule; data: a packaged prompt set's split sizes; padding: the batch cuts it prices at realistic lengths
}
# Units that import nothing heavier than the standard library, numpy, scipy, torch, matplotlib (plots) and PyYAML
# (docs/architecture.md), and two such modules of heavier units.
LIGHT = {"types", "rundir", "cache", "memory", "http", "tables", "padding", "advantages", "monitors", "report"}
LIGHT_MODULES = {"teacli.eval.stats", "teacli.diagnostics.synthetic"}
LIGHT_LIBRARIES = {"numpy", "scipy", "torch", "matplotlib", "yaml"}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "teacli"


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return out


def _graph() -> dict[Path, list[str]]:
    return {p: _imports(p) for p in PACKAGE.rglob("*.py")}


def test_every_unit_imports_only_what_sits_below_it():
    bad = []
    for path, imported in _graph().items():
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        unit = _unit(".".join(rel.parts))
        if unit in ("cli", "__init__", "teacli"):
            continue  # the CLI sits on top of everything
        allowed = ALLOWED[unit] | {unit}
        for name in imported:
            if not name.startswith("teacli."):
                continue
            target = _unit(name)
            if target in allowed:
                continue
            bad.append(f"{rel}: imports {name} ({unit} → {target})")
    assert not bad, "\n".join(sorted(set(bad)))


def test_every_unit_is_in_the_table():
    units = {_unit(".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)) for p in PACKAGE.rglob("*.py")}
    assert units - {"cli", "__init__", "teacli"} <= set(ALLOWED), sorted(units - set(ALLOWED) - {"cli", "__init__", "teacli"})


def test_light_units_import_no_heavy_library():
    """No transformers, deepspeed, vllm, httpx, peft ... in the units below the stages (and torch, where a light unit
    uses it, only as the tensors it computes on)."""
    import sys

    bad = []
    for path, imported in _graph().items():
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        if _unit(module) not in LIGHT and module not in LIGHT_MODULES:
            continue
        for name in imported:
            top = name.split(".")[0]
            if top not in ("teacli", "__future__") and top not in sys.stdlib_module_names and top not in LIGHT_LIBRARIES:
                bad.append(f"{module}: imports {name}")
    assert not bad, "\n".join(sorted(set(bad)))


def test_the_allowed_graph_has_no_cycle():
    seen, stack = set(), set()

    def visit(u: str) -> None:
        assert u not in stack, f"import cycle through {u}"
        if u in seen:
            return
        stack.add(u)
        for v in ALLOWED.get(u, ()):
            visit(v)
        stack.discard(u)
        seen.add(u)

    for unit in ALLOWED:
        visit(unit)


@pytest.mark.parametrize("library,home", [("deepspeed", "teacli/train/backend.py"), ("vllm", "teacli/rollout/vllm_engine.py")])
def test_one_importer_per_heavy_engine(library, home):
    importers = sorted(
        str(p.relative_to(PACKAGE.parent)) for p, names in _graph().items() if any(n.split(".")[0] == library for n in names)
    )
    assert importers == [home]


def test_report_never_imports_train_or_rollout():
    for path, imported in _graph().items():
        if "report" in path.relative_to(PACKAGE).parts[:1]:
            assert not [n for n in imported if n.startswith(("teacli.train", "teacli.rollout", "torch"))], path


def test_no_module_imports_in_a_circle():
    """Module level, lazy imports included: e.g. an engine factory in the protocol module that the
    engines themselves import would be a circle."""
    graph = _graph()
    modules = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p for p in graph}
    edges = {
        name: {n for n in graph[path] if n in modules and n != name and not name.startswith(n + ".")}
        for name, path in modules.items()
    }
    done: set[str] = set()

    def visit(node: str, trail: tuple[str, ...]) -> None:
        if node in trail:
            raise AssertionError("import circle: " + " → ".join(trail[trail.index(node):] + (node,)))
        if node in done:
            return
        for nxt in edges[node]:
            visit(nxt, trail + (node,))
        done.add(node)

    for name in modules:
        visit(name, ())
