"""Seeds of one method → one method row of `tea report`.

Which runs are seeds of one method: runs whose recipe.yaml are equal in everything but `seed` (same
`name`, same settings; `tea study` with `seeds:` trains them with `--set seed=<s>`) and whose seeds
differ. Such a group becomes one method, named by the recipe's `name`; any other run stays its own
method, named by its directory. Two runs of one recipe with the same seed are an error (the report
would count one training run twice).

How seeds are combined (docs/evaluation.md, "Seeds"):
  * per prompt and per N, the method's value is the mean over its seeds of the seeds' grouped
    best-of-N values (over the prompts every seed evaluated);
  * the paired prompt bootstrap, win/tie/loss and the frontier's interval then treat those
    seed-averaged per-prompt values like one run's: the interval is over prompts, with the seeds'
    spread averaged in, not a between-seed interval (with 3 seeds that would be meaningless);
  * the mean completion length pools every completion of every seed (each seed has the same M per
    prompt, so it is also the mean of the seeds' means);
  * the evaluated checkpoint of each seed is shown as "s0:40 s1:30 …" (each seed's own selection).
Each seed also keeps its own row (the `seeds` table), paired seed by seed with its baseline's run of
the same seed, so the spread across seeds is visible.

Imports only the standard library and numpy (docs/architecture.md import rule).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from teacli.report.read import RecipeInfo, ReportError, RunEval


@dataclass
class Method:
    """One row of the report: a single run, or the seeds of one recipe pooled."""

    name: str
    members: list[int]  # indices into the reported runs, by seed for a pooled method

    @property
    def pooled(self) -> bool:
        return len(self.members) > 1


def group_runs(paths: Sequence[Path], names: Sequence[str], infos: Sequence[RecipeInfo]) -> list[Method]:
    """The methods of a report, in the order of their first run; seeds of one recipe grouped."""
    by_identity: dict[tuple[str, str], list[int]] = {}
    for i, info in enumerate(infos):
        if info.name is not None and info.identity is not None and info.seed is not None:
            by_identity.setdefault((info.name, info.identity), []).append(i)
    group_of: dict[int, list[int]] = {}
    for members in by_identity.values():
        if len(members) < 2:
            continue
        seen: dict[int, int] = {}
        for i in members:
            seed = infos[i].seed
            if seed in seen:
                raise ReportError(f"runs {paths[seen[seed]]} and {paths[i]} are the same recipe ({infos[i].name}) with the "
                                  f"same seed {seed}: report one of them (seeds of one method must differ)")
            seen[seed] = i
        ordered = sorted(members, key=lambda i: infos[i].seed)
        for i in members:
            group_of[i] = ordered
    methods, done = [], set()
    taken = set(names)
    for i in range(len(paths)):
        if i in done:
            continue
        members = group_of.get(i, [i])
        done.update(members)
        if len(members) == 1:
            methods.append(Method(names[i], members))
            continue
        name = infos[i].name
        assert name is not None
        if name in taken and names.index(name) not in members:
            name = f"{name} (seeds)"  # a run directory of another method already has the recipe's name
        methods.append(Method(name, members))
    return methods


def aliases(methods: Sequence[Method], paths: Sequence[Path], names: Sequence[str], infos: Sequence[RecipeInfo]) -> dict[str, str]:
    """What `--baseline` / `--pair` may name → the method: its name, each of its runs' name or path, and the
    recipe name of a method of one run (so a study's `--baseline RECIPE` works with one seed too)."""
    out: dict[str, str] = {}
    by_recipe: dict[str, list[str]] = {}
    for m in methods:
        out[m.name] = m.name
        for i in m.members:
            out[names[i]] = m.name
            out[str(paths[i])] = m.name
            if infos[i].name is not None:
                by_recipe.setdefault(infos[i].name, []).append(m.name)
    for recipe, ms in by_recipe.items():
        if len(set(ms)) == 1:
            out.setdefault(recipe, ms[0])
    return out


def pool(name: str, seeds: Sequence[RunEval]) -> RunEval:
    """The seed-averaged method of `seeds` (RunEval of one recipe, one seed each), per the module docstring."""
    first = seeds[0]
    for r in seeds[1:]:
        if r.N != first.N:
            raise ReportError(f"seed runs {first.name} and {r.name} of {name} report different N ({first.N} vs {r.N})")
    common = set.intersection(*(set(r.per_prompt) for r in seeds))
    prompts = [pid for pid in first.per_prompt if pid in common]
    if not prompts:
        raise ReportError(f"the seed runs of {name} ({', '.join(r.name for r in seeds)}) share no evaluated prompt")
    per_prompt = {pid: np.mean([r.per_prompt[pid] for r in seeds], axis=0).tolist() for pid in prompts}
    have_records = all(r.tokens is not None and r.rewards is not None for r in seeds)
    tokens = {pid: [t for r in seeds for t in r.tokens[pid]] for pid in prompts} if have_records else None  # type: ignore[index]
    rewards = {pid: [x for r in seeds for x in r.rewards[pid]] for pid in prompts} if have_records else None  # type: ignore[index]
    checkpoint = " ".join(f"s{r.recipe.seed if r.recipe else '?'}:{r.checkpoint}" for r in seeds)
    return RunEval(
        name=name, path=first.path, split=first.split, M=first.M, checkpoint=checkpoint, N=list(first.N),
        per_prompt=per_prompt, tokens=tokens, rewards=rewards, group_size=first.group_size, advantage=first.advantage,
        params=dict(first.params), judge=[], recipe=first.recipe, seeds=list(seeds),
    )
