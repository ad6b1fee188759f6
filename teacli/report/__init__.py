"""`tea report`: tables (Markdown, LaTeX, CSV) and plots (PNG) from run directories alone.

`read.py` reads and checks the run directories, `compare.py` computes the comparisons (each run
against its baseline, Best TTA, the extra W/T/L rows), `build.py` lays them out as the paper's tables
(formatted by teacli/tables.py) and writes the report, `plots.py` draws the frontier and delta plots.
Imports only the standard library, numpy, scipy, PyYAML and matplotlib (docs/architecture.md import
rule): never train/, rollout/ or torch, so evaluation produced on a cluster can be reported anywhere.
"""
