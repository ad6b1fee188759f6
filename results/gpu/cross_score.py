"""The LM-judge runs' best-of-256 picks scored by the rule reward: what best-of-256 under the judge would
deploy (the highest-judged of a prompt's 256 samples, kept with its text by collect.py as
`<split>-M256.best.json.gz`) checked by a reward that does not share the judge's weaknesses. The built-in
held-out prompts carry the rule reward's constraints, so every pick can be scored by both.

Per run: the judge's mean score of its picks (= its bo256), the rule reward's mean score of the same picks,
its difference from the same seed's GRPO run's picks (paired prompt bootstrap, teacli.eval.stats, 1,000
resamples, seed 0), the share of picks that write a new chat turn in one of the two forms the runs found, and
the picks' mean length. The two forms (either is consistent with SmolLM2 emitting `<|im_start|>`, which
decoding drops, then a role and a made-up instruction):
  * "system" turn: a line that ends in "system" after at most 40 other characters;
  * instruction: a line that, after at most 40 other characters, says "Your response/answer should/must …"
    or "please explicitly add …", the phrasing of the held-out prompts' constraints (the tea-s1 run writes
    "…\nYour response should contain at least 3 sentences. The response must contain exactly 3 bullet
    points…" after its answer).

    python results/gpu/cross_score.py > results/gpu/cross_score_judge.md
"""

import gzip
import json
import re
from pathlib import Path

import numpy as np

from teacli.data.load import load_split
from teacli.eval.stats import paired_bootstrap
from teacli.rewards.rule import RuleReward

HERE = Path(__file__).resolve().parent

TURN = re.compile(r"(^|\n)[^\n]{0,40}system\n", re.IGNORECASE)
INSTRUCTION = re.compile(r"(^|\n)[^\n]{0,40}?(your (entire )?(response|answer) (should|must)|please explicitly add)", re.IGNORECASE)


def main() -> None:
    prompts = {p.id: p for p in load_split("builtin", "heldout_ext")}
    rule = RuleReward()
    runs = {}
    for best in sorted(HERE.glob("runs/*judge*/eval/heldout_ext-M256.best.json.gz")):
        picks = sorted(json.loads(gzip.open(best, "rt").read()), key=lambda p: p["prompt_id"])
        ruled = np.array([rule.score_one(prompts[p["prompt_id"]], p["response"]) for p in picks])
        runs[best.parents[1].name] = (picks, ruled)
    print("| run (LM-judge reward) | picks | judge score of the picks (bo256) | rule score of the picks | − GRPO's (same seed) "
          "| picks with a \"system\" turn | with an instruction | with either | mean tokens |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, (picks, ruled) in runs.items():
        grpo = re.sub(r"_(grpo_z|tea)-s", "_grpo-s", name)  # the same seed's GRPO run (itself for a GRPO run)
        delta = "" if grpo == name or grpo not in runs else "{:+.3f} [{:+.3f}, {:+.3f}]".format(*paired_bootstrap(ruled, runs[grpo][1], 1000, 0))
        judged = np.mean([p["reward"] for p in picks])
        turns = np.array([bool(TURN.search(p["response"])) for p in picks])
        asks = np.array([bool(INSTRUCTION.search(p["response"])) for p in picks])
        tokens = np.mean([p["tokens"] for p in picks])
        print(f"| {name} | {len(picks)} | {judged:.3f} | {ruled.mean():.3f} | {delta} | {turns.mean():.0%} | {asks.mean():.0%} "
              f"| {(turns | asks).mean():.0%} | {tokens:.1f} |")


if __name__ == "__main__":
    main()
