"""Fills docs/results.md from docs/results.src.md: every `<!-- quote: FILE -->` line is followed by
FILE's content (FILE relative to docs/), so the doc's numbers come from the files the study wrote.
Run from the repo root: `python docs/results/build_doc.py`."""

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent
MARK = re.compile(r"^<!-- quote: (\S+) -->$")


def render(src: str) -> str:
    out = []
    for line in src.split("\n"):
        out.append(line)
        m = MARK.match(line)
        if m:
            out.append((DOCS / m.group(1)).read_text().rstrip("\n"))
            out.append("<!-- /quote -->")
    return "\n".join(out)


if __name__ == "__main__":
    (DOCS / "results.md").write_text(render((DOCS / "results.src.md").read_text()))
    print("wrote docs/results.md")
