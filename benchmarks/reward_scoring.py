"""The reward model's scoring at a recipe's shapes, variant by variant, side by side in one process.

    python benchmarks/reward_scoring.py uf_llama1b_tea --card h200                    # reward.kernels eager, liger, compile
    python benchmarks/reward_scoring.py uf_llama1b_tea --kernels eager,liger --batch-sizes 16,32,64
    python benchmarks/reward_scoring.py uf_llama1b_tea --kernels eager --before          # against the scoring loop before
    python benchmarks/reward_scoring.py uf_llama1b_tea --kernels eager --share off,on    # each prompt once or m times (default)
    python benchmarks/reward_scoring.py uf_llama1b_tea --kernels liger --share on,packed --lengths realistic

Builds the recipe's reward model as a rehearsal does (random weights of exactly its shape, `teacli.standins`; a local
directory with a config.json works too, `--model`) and the conversations of one step as a rehearsal scores them: P × m
of them (`rollout.prompts_per_step` × `rollout.group_size`), each a prompt of `rehearsal.prompt_tokens` words and a
response of `rollout.max_new_tokens` words of the stand-in vocabulary (one token each, as a rehearsal's decoded
completions). For every variant (`reward.kernels` × `reward.batch_size`; liger last, since its patches stay on the
architecture's classes), one untimed call (warm-up, compilation) and `--repeats` timed ones; printed: the median
seconds of the host's part (`encode`: the chat template and tokenizer) and of the device's (`score`: the batched
forwards and the one read-back), tokens/s, the forward's floor on the card (`teacli.planner.forward_floor`: its FLOPs
at the card's dense bf16 peak), time / floor, MFU, and the largest difference from the first variant's scores in
units of their standard deviation. Target (docs/reproducing.md): reward scoring >= 55% MFU.

`--before` adds, first and with the first kernels, rows for the scoring loop as it was before it stopped waiting for
the GPU (each batch copied from pageable memory and read back before the next, the attention mask passed): kernel
for kernel the same forwards, so the two rows compare the loops.

`--share` (default `off,on`): each variant with `reward.share_prompts` off (every conversation whole) and on (each
group's common prefix once, the responses on its KV cache), side by side: `shared` says which, `tokens` counts the
conversations' tokens and `run` the tokens the model ran; tokens/s is conversation tokens a second (what the step
sees), the floor and MFU count the tokens run (at the conversations' mean context). A model whose cache cannot be
shared (`teacli.rewards.hf.sharing_problem`) gets the `off` rows only. `packed`: shared, and the responses laid end
to end in rows (`reward.pack_responses`; sdpa and eager attention). `padded` is the share of the tokens the forwards
computed that was padding (metrics.jsonl pad_frac_reward). `--lengths realistic` draws the step's prompt and response
lengths as `rehearsal.lengths: realistic` does (where the padding shows; fixed lengths have almost none).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time


def conversations(recipe, vocab: int, seed: int = 0, lengths: str = "fixed") -> tuple[list, list[str]]:
    """(prompts, responses) of one step of `recipe` at a rehearsal's lengths, words `t<i>` of the stand-in vocabulary
    (ids 1000 from either end of it: no special token). `lengths` realistic: drawn as `rehearsal.lengths: realistic`
    draws them (`teacli.planner.Lengths`), else `rehearsal.prompt_tokens` and `rollout.max_new_tokens` words each."""
    from teacli.planner import Lengths
    from teacli.types import Prompt

    rng = random.Random(seed)
    words = lambda n: " ".join(f"t{rng.randrange(1000, vocab - 1000)}" for _ in range(n))  # noqa: E731
    groups, m = recipe.rollout.prompts_per_step, recipe.rollout.group_size
    if lengths == "realistic":
        plen, rlen = Lengths().draw(groups, m, seed, recipe.data.max_prompt_tokens, recipe.rollout.max_new_tokens)
    else:
        plen, rlen = [recipe.rehearsal.prompt_tokens] * groups, [recipe.rollout.max_new_tokens] * (groups * m)
    prompts = [Prompt(id=f"p{i}", messages=({"role": "user", "content": words(n)},)) for i, n in enumerate(plen)]
    return [p for p in prompts for _ in range(m)], [words(n) for n in rlen]


def score_before(rm, encoded: list[list[int]]):
    """The scoring loop before (teacli/rewards/hf.py until 2026-11-28): batch by batch, longest first, each copied to the
    device from pageable memory, run with its attention mask and read back before the next is built."""
    import torch

    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]), reverse=True)
    scores = torch.empty(len(encoded), dtype=torch.float32)
    with torch.no_grad():
        for start in range(0, len(order), rm.batch_size):
            rows = order[start : start + rm.batch_size]
            input_ids, mask = (t.to(rm.device) for t in rm._pack([encoded[i] for i in rows]))
            hidden = rm.model.base_model(input_ids=input_ids, attention_mask=mask).last_hidden_state
            last = mask.sum(dim=1) - 1
            scores[rows] = rm.model.score(hidden[torch.arange(len(rows), device=rm.device), last])[:, 0].float().cpu()
    return scores


def measure(rm, prompts, responses, repeats: int, before: bool = False) -> dict:
    """Median seconds of encoding and of scoring over `repeats` calls after an untimed one; the tokens (and those the
    model ran: fewer with rm.share_prompts); the scores. `before`: with the scoring loop before (`score_before`)."""
    import torch

    encode, score = [], []
    keys = [p.id for p in prompts]
    for k in range(repeats + 1):
        t0 = time.perf_counter()
        encoded = [rm.encode(p, r) for p, r in zip(prompts, responses)]
        t1 = time.perf_counter()
        if rm.device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        run, padded = rm.tokens_run, rm.tokens_padded
        scores = score_before(rm, encoded) if before else rm._score_encoded(encoded, keys)
        t3 = time.perf_counter()
        if k:
            encode.append(t1 - t0)
            score.append(t3 - t2)
    tokens = sum(len(ids) for ids in encoded)
    return {"encode": statistics.median(encode), "score": statistics.median(score), "scores": scores,
            "tokens": tokens, "run": tokens if before else rm.tokens_run - run, "sequences": len(encoded),
            "padded": 0.0 if before else (rm.tokens_padded - padded) / max(1, rm.tokens_padded - padded + rm.tokens_run - run)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", help="a recipe name or file (its reward model, step size and lengths)")
    parser.add_argument("--model", default=None, help="another reward model: a name tea has a shape for, or a local directory")
    parser.add_argument("--kernels", default="eager,liger,compile", help="comma-separated reward.kernels values")
    parser.add_argument("--batch-sizes", default=None, help="comma-separated reward.batch_size values (default: the recipe's)")
    parser.add_argument("--card", default="h200", help="the card whose peak gives the floor (teacli.planner.CARDS)")
    parser.add_argument("--device", default=None, help="default: cuda where there is one, else cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", action="store_true", help="rows for the scoring loop before, first (a decoder tea pools)")
    parser.add_argument("--share", default="off,on", help="comma-separated: off, on (reward.share_prompts), packed "
                        "(and reward.pack_responses)")
    parser.add_argument("--lengths", default="fixed", choices=("fixed", "realistic"), help="the step's lengths, as "
                        "rehearsal.lengths draws them")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="a recipe override, KEY=VALUE")
    a = parser.parse_args(argv)

    import torch

    from teacli import planner, standins
    from teacli.config import find_recipe, load_recipe
    from teacli.logprobs import packing_problem
    from teacli.rewards.hf import HFRewardModel

    if a.card not in planner.CARDS:
        parser.error(f"--card: {a.card!r} is not one of {', '.join(planner.CARDS)}")
    try:  # a recipe or model tea cannot find or has no shape for: one line naming it (RecipeError is a ValueError)
        recipe = load_recipe(find_recipe(a.recipe), a.overrides, advantage=False)
        name = a.model or recipe.reward.name_or_path
        if not name:
            parser.error(f"{a.recipe}: its reward has no model (reward.kind {recipe.reward.kind}); give --model")
        path = standins.model_dir(name, "reward")
        shape = planner.model_shape(name, "reward", classifier=True)
    except ValueError as exc:
        parser.error(str(exc))
    card = planner.CARDS[a.card]
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    kernels = sorted(a.kernels.split(","), key=lambda k: k == "liger")  # liger's patches outlive its model
    sizes = [int(b) for b in a.batch_sizes.split(",")] if a.batch_sizes else [recipe.reward.batch_size]
    shares = [v.strip() for v in a.share.split(",")]
    if not shares or any(v not in ("off", "on", "packed") for v in shares):
        parser.error(f"--share: {a.share!r}; give a comma list of off, on and packed")

    print(f"reward model {name} ({shape.params / 1e9:.2f}B parameters, stand-in), {a.dtype} on {device}; floor on {card.name}")
    print(f"lengths {a.lengths}")
    print("| kernels | batch size | shared | sequences | tokens | run | padded | encode s | score s | tokens/s | floor s | × floor | MFU | max |Δ| (std) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    first = None
    for kind in kernels:
        rm = HFRewardModel.from_pretrained(str(path), dtype=a.dtype, device=device, max_length=recipe.reward.max_length, kernels=kind)
        prompts, responses = conversations(recipe, len(rm.tokenizer), lengths=a.lengths)
        if a.before and kind == kernels[0] and not rm._own_pooling:
            parser.error(f"--before: {name} is not a decoder tea pools itself; the loop before is timed for those only")
        can_share = rm.share_prompts  # False where the cache does not apply (sharing_problem) or kernels compile
        can_pack = packing_problem(rm.model) is None
        variants = [(size, before, "off") for before in ((True,) if a.before and kind == kernels[0] else ()) for size in sizes]
        variants += [(size, False, share) for size in sizes for share in shares
                     if share == "off" or (can_share and (share == "on" or can_pack))]
        for size, before, share in variants:
            rm.batch_size, rm.share_prompts, rm.pack_responses = size, share != "off", share == "packed"
            got = measure(rm, prompts, responses, a.repeats, before)
            floor = planner.forward_floor(shape, card, got["run"], got["tokens"] / got["sequences"])
            if first is None:
                first = got["scores"]
            drift = float((got["scores"] - first).abs().max() / first.std().clamp(min=1e-12))
            print(f"| {kind}{' (loop before)' if before else ''} | {size} | {share} | {got['sequences']} | "
                  f"{got['tokens']:,} | {got['run']:,} | {got['padded']:.1%} | {got['encode']:.2f} | {got['score']:.2f} | "
                  f"{got['tokens'] / got['score']:,.0f} | {floor:.2f} | {got['score'] / floor:.1f}× | {floor / got['score']:.0%} | "
                  f"{drift:.3f} |", flush=True)
        del rm
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
