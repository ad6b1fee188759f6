"""Fills results/record.md from results/record.src.md: every `<!-- quote: FILE -->` line is followed by
FILE's content (FILE relative to results/), so the record's numbers come from the files the studies wrote.
Run from the repo root: `python results/build_doc.py`."""

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARK = re.compile(r"^<!-- quote: (\S+) -->$")


def render(src: str) -> str:
    out = []
    for line in src.split("\n"):
        out.append(line)
        m = MARK.match(line)
        if m:
            out.append((HERE / m.group(1)).read_text().rstrip("\n"))
            out.append("<!-- /quote -->")
    return "\n".join(out)


if __name__ == "__main__":
    (HERE / "record.md").write_text(render((HERE / "record.src.md").read_text()))
    print("wrote results/record.md")
