"""`tea report`: tables (Markdown, LaTeX, CSV) and plots (PNG) from run directories alone.

`build.py` reads the evaluation files of run directories and computes the comparisons,
`tables.py` writes the paper's table layouts, `plots.py` draws the frontier and delta plots.
Imports only the standard library, numpy, scipy and matplotlib (DESIGN import rule): never
train/, rollout/ or torch, so evaluation produced on a cluster can be reported anywhere.
"""
