"""Held-out evaluation: `bon.py` (tea eval-bon: sample, score, grouped best-of-N records),
`judge.py` (tea judge: pairwise LLM judge of two runs' selections) and `stats.py` (grouped
best-of-N, paired prompt bootstrap, win/tie/loss; numpy only).

Nothing is imported here, so `teacli.eval.stats` stays importable without torch.
"""
