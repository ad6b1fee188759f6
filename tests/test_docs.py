"""The docs describe the repository as it is: README's file list names every module, folder and doc,
no document points at a Markdown file that is not in the repository, and no committed record names a machine's path."""

import gzip
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _files_block() -> str:
    readme = (REPO / "README.md").read_text()
    return readme.split("## Files", 1)[1]


def test_readme_file_list_names_every_module_folder_and_doc():
    block = _files_block()
    pkg = REPO / "teacli"
    expected = [p.name for p in pkg.glob("*.py") if p.name != "__init__.py"]
    expected += [f"{p.name}/" for p in pkg.iterdir() if p.is_dir() and any(p.glob("*.py"))]
    expected += [p.name for p in (REPO / "docs").glob("*.md")]
    expected += ["recipes/", "scripts/", "benchmarks/", "tests/", "docs/", ".ci/run", "setup.py", "pyproject.toml"]
    missing = [name for name in expected if name not in block]
    assert missing == []


def test_no_document_points_at_a_missing_markdown_file():
    docs = [REPO / "README.md", REPO / "CHANGELOG.md", *(REPO / "docs").glob("*.md")]
    missing = []
    for doc in docs:
        # Paths into docs/ and top-level docs (README.md, DESIGN.md); not the report.md files the tool writes.
        for name in set(re.findall(r"\bdocs/[\w.-]+\.md\b|\b[A-Z][A-Z_]+\.md\b", doc.read_text())):
            if not any((base / name).exists() for base in (REPO, REPO / "docs", doc.parent)):
                missing.append(f"{doc.relative_to(REPO)}: {name}")
    assert missing == []


def test_ci_runs_readme_test_command_then_the_slow_stage():
    """.ci/run's first stage is README's test command, character for character; its second runs the slow tests."""
    readme = (REPO / "README.md").read_text()
    command = readme.split("Run the tests:", 1)[1].split("```bash\n", 1)[1].split("\n```", 1)[0]
    ci = (REPO / ".ci" / "run").read_text()
    assert "\n" not in command and f"\n{command}\n" in ci
    assert "\npython -m pytest -q -m 'slow and not gpu' --durations=20\n" in ci


MACHINE_PATH = re.compile(r"(?:^|[^\w.~-])/(?:tmp|opt|work|root|home|mnt|scratch)/")


def test_no_committed_record_names_a_machine_path():
    """Records brought back from GPU machines (study logs, test logs, run files) are committed with paths relative to
    the repository: a path on the machine that wrote them (its /tmp checkout, its venv under /opt) means nothing to a
    reader. Docs, recipes, scripts and benchmarks, gzipped records included."""
    roots = [REPO / d for d in ("docs", "results", "recipes", "scripts", "benchmarks")] + [REPO / "README.md", REPO / "CHANGELOG.md"]
    files = [f for r in roots for f in ([r] if r.is_file() else r.rglob("*")) if f.is_file()]
    hits = []
    for f in files:
        if f.suffix in (".png", ".pdf"):
            continue
        data = gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if MACHINE_PATH.search(line):
                hits.append(f"{f.relative_to(REPO)}:{n}: {line.strip()[:120]}")
    assert hits == []


def test_readme_names_every_command_source_and_benchmark():
    """README's command table has a row for every `tea` command (sub-commands included), its prepare-data row every
    source, and its file list every benchmark script (a new user met `tea diagnose hacking` and `builtin-hard`
    nowhere in README, and 6 of 15 benchmarks)."""
    import typer

    from teacli.cli import app
    from teacli.data.sources import SOURCES

    readme = (REPO / "README.md").read_text()
    table = "\n".join(line for line in readme.splitlines() if line.startswith("| `tea "))
    group = typer.main.get_group(app)
    names = []
    for name, cmd in group.commands.items():
        subs = getattr(cmd, "commands", None)
        names += [f"tea {name} {sub}" for sub in subs] if subs else [f"tea {name}"]
    missing = [n for n in names if f"`{n}" not in table and not (n.startswith("tea recipes") and "`tea recipes list" in table)]
    assert missing == []
    assert [s for s in SOURCES if f"`{s}`" not in table] == []
    assert [p.name for p in (REPO / "benchmarks").glob("*.py") if p.name not in readme] == []
