"""Table writers: one `Table` (typed cells) → Markdown, LaTeX (booktabs, the paper's style) and CSV.

Cell types carry their numbers so each format shows them its own way:
  * float                 3 decimals ("13.718")
  * Delta(d, lo, hi)      "+1.569 [+1.305, +1.819]" / \\(+1.569\\,[+1.305,+1.819]\\) / CSV: three columns
  * WTL(w, t, l)          percentages "78.4/0.8/20.8" / CSV: counts W, T, L
  * WL(w, l)              "152–98" (judge wins–losses)
  * str, int              as is
Imports only the standard library.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union


@dataclass(frozen=True)
class Delta:
    delta: float
    lo: float
    hi: float


@dataclass(frozen=True)
class WTL:
    win: int
    tie: int
    loss: int

    def percents(self) -> tuple[float, float, float]:
        n = max(1, self.win + self.tie + self.loss)
        return 100.0 * self.win / n, 100.0 * self.tie / n, 100.0 * self.loss / n


@dataclass(frozen=True)
class WL:
    win: int
    loss: int


Cell = Union[str, int, float, Delta, WTL, WL, None]


@dataclass
class Table:
    name: str  # file stem, e.g. "frontier"
    caption: str
    header: list[str]
    rows: list[list[Cell]] = field(default_factory=list)
    midrule_before: set[int] = field(default_factory=set)  # row indices with a rule above them (LaTeX)


def _num(x: float, signed: bool = False) -> str:
    return f"{x:+.3f}" if signed else f"{x:.3f}"


def _text(cell: Cell) -> str:
    if cell is None:
        return "–"
    if isinstance(cell, bool):
        return str(cell)
    if isinstance(cell, float):
        return _num(cell)
    if isinstance(cell, Delta):
        return f"{_num(cell.delta, True)} [{_num(cell.lo, True)}, {_num(cell.hi, True)}]"
    if isinstance(cell, WTL):
        return "/".join(f"{p:.1f}" for p in cell.percents())
    if isinstance(cell, WL):
        return f"{cell.win}–{cell.loss}"
    return str(cell)


def markdown(table: Table) -> str:
    """A GitHub Markdown table with the caption as a bold line above it."""
    align = ["---" if i == 0 else "---:" for i in range(len(table.header))]
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = [f"**{table.caption}**", "", "| " + " | ".join(esc(h) for h in table.header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(esc(_text(c)) for c in row) + " |" for row in table.rows]
    return "\n".join(lines) + "\n"


_LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                   "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIALS.get(ch, ch) for ch in text)


def _latex_header(h: str) -> str:
    # "Δbo128" → \(\Delta\)bo128 as in the paper; everything else escaped.
    h = latex_escape(h)
    return h.replace("Δ", r"\(\Delta\)").replace("–", "--")


def _latex_cell(cell: Cell) -> str:
    if isinstance(cell, Delta):
        return rf"\({_num(cell.delta, True)}\,[{_num(cell.lo, True)},{_num(cell.hi, True)}]\)"
    if isinstance(cell, WL):
        return f"{cell.win}--{cell.loss}"
    return latex_escape(_text(cell)).replace("–", "--")


def latex(table: Table, label_prefix: str = "tab:tea_report_") -> str:
    """A `table` float with a booktabs tabular: first column left-aligned, the rest as the paper's."""
    cols = "l" + "".join("c" if _is_wide(table, i) else "r" for i in range(1, len(table.header)))
    out = [r"\begin{table}[!htbp]", r"\centering", r"\small", rf"\caption{{{latex_escape(table.caption)}}}",
           rf"\label{{{label_prefix}{table.name}}}", rf"\begin{{tabular}}{{@{{}}{cols}@{{}}}}", r"\toprule",
           " & ".join(_latex_header(h) for h in table.header) + r" \\", r"\midrule"]
    for i, row in enumerate(table.rows):
        if i in table.midrule_before:
            out.append(r"\midrule")
        out.append(" & ".join(_latex_cell(c) for c in row) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(out) + "\n"


def _is_wide(table: Table, col: int) -> bool:
    return any(isinstance(row[col], (Delta, WTL, WL)) for row in table.rows if col < len(row))


def csv_text(table: Table) -> str:
    """CSV with raw numbers: a Delta column becomes `<col>`, `<col> lo`, `<col> hi`; a W/T/L column
    becomes `<col> W`, `<col> T`, `<col> L` (counts); a W–L column `<col> W`, `<col> L`."""
    kinds = []
    for i in range(len(table.header)):
        found = {type(row[i]) for row in table.rows if i < len(row) and row[i] is not None}
        kinds.append(next((k for k in (Delta, WTL, WL) if k in found), None))
    suffixes = {Delta: ["", " lo", " hi"], WTL: [" W", " T", " L"], WL: [" W", " L"], None: [""]}
    header = [f"{h}{s}" for h, kind in zip(table.header, kinds) for s in suffixes[kind]]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in table.rows:
        flat: list[Any] = []
        for cell, kind in zip(row, kinds):
            if cell is None:
                flat += [""] * len(suffixes[kind])
            elif isinstance(cell, Delta):
                flat += [repr(cell.delta), repr(cell.lo), repr(cell.hi)]
            elif isinstance(cell, WTL):
                flat += [cell.win, cell.tie, cell.loss]
            elif isinstance(cell, WL):
                flat += [cell.win, cell.loss]
            elif isinstance(cell, float):
                flat.append(repr(cell))
            else:
                flat.append(cell)
        writer.writerow(flat)
    return buf.getvalue()


def write_all(tables: list[Table], out: Path) -> dict[str, list[Path]]:
    """<name>.md, <name>.tex and <name>.csv for every table under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, list[Path]] = {}
    for t in tables:
        paths = [out / f"{t.name}.md", out / f"{t.name}.tex", out / f"{t.name}.csv"]
        paths[0].write_text(markdown(t))
        paths[1].write_text(latex(t))
        paths[2].write_text(csv_text(t))
        written[t.name] = paths
    return written
