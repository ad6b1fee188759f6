"""Seeds of one method → one method row of `tea report`.

Which runs are seeds of one method: runs whose recipe.yaml are equal in everything but `seed` (same
`name`, same settings; `tea study` with `seeds:` trains them with `--set seed=<s>`) and whose seeds
differ. Such a group becomes one method, named by the recipe's `name`; any other run stays its own
method, named by its directory. Two runs of one recipe with the same seed are an error (the report
would count one training run twice). The recipes compare at the values the runs ran under: a key a
recipe.yaml lacks at its default under the tea_schema that wrote it (teacli/config/schema.py). Seeds
of one recipe written under two versions that differ only where a default changed between them ran
differently, and are an error naming each such key and both values (they are neither one method nor
two methods the user meant).

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

from teacli.report.read import RecipeInfo, ReportError, RunEval, default_split


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
    _refuse_default_splits(paths, infos, by_identity)
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


def _refuse_default_splits(paths: Sequence[Path], infos: Sequence[RecipeInfo], by_identity: dict[tuple[str, str], list[int]]) -> None:
    """A ReportError when two seeds of one recipe differ only where a default changed between the tea_schema versions
    that wrote them (`read.default_split`), naming the runs, each such key and both values."""
    groups = list(by_identity.items())
    for x, ((name, _), first) in enumerate(groups):
        for (other, _), second in groups[x + 1:]:
            if other != name:
                continue
            pair = next(((i, j) for i in first for j in second if infos[i].seed != infos[j].seed), None)
            moved = default_split(infos[pair[0]], infos[pair[1]]) if pair else {}
            if not moved:
                continue
            i, j = pair
            values = "; ".join(f"{k} {a!r} in {paths[i]}, {b!r} in {paths[j]}" for k, (a, b) in moved.items())
            raise ReportError(f"runs {paths[i]} (seed {infos[i].seed}) and {paths[j]} (seed {infos[j].seed}) are seeds of recipe "
                              f"{name} written under tea_schema {infos[i].schema} and {infos[j].schema}, whose defaults differ, "
                              f"and they ran differently: {values}; they are not one method: set the key in the recipe to the "
                              f"value its seeds should share and train the seeds that ran otherwise again")


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
