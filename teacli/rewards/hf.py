"""Sequence-classification reward models (kind 'hf'), e.g. Skywork-Reward-V2.

The score of a response is the reward model's scalar logit for the conversation
[prompt messages..., assistant: response], rendered with the reward model's OWN chat template
(not the policy's) and tokenized without a doubled BOS (`teacli.models.encode_chat`).

Responses are scored in batches grouped by token length (sorted, batched, unsorted) so that padding is small: as
many batches as `reward.batch_size` rows a batch make, cut where they compute the fewest tokens with none computing
more than `reward.batch_size` of the longest rows (`batch_sizes`); the result does not depend on the batching. The
padding the batches ran is counted (`tokens_padded`: metrics.jsonl pad_frac_reward). Departures from calling the
model's forward on each example:

  * Pooling. transformers' sequence classifiers score the rightmost token that is not the pad
    token. When pad = eos (a Llama tokenizer without a pad token) and the template ends the turn
    with eos, that is the token BEFORE the end of the turn. For the generic classifiers (Llama,
    Qwen, Mistral, Gemma, ...) we run the backbone and apply the score head at the last attended
    token ourselves, so the score is the last token's whatever the pad id; other architectures
    use their own forward (right padding, `config.pad_token_id` set).
  * Truncation keeps the END of a conversation longer than `reward.max_length` (and a leading
    BOS): the response and the end-of-turn token the score is read from.
  * Shared prompts (`reward.share_prompts`, on by default). The m responses of a group answer one prompt, so
    their token sequences begin alike. `score` groups the rows of one prompt id and takes the group's longest
    common token prefix (of the encoded sequences themselves, so a template that merges tokens across the
    prompt/response boundary, or a cut conversation, only shortens it), less at least the last token of each row.
    Groups of two or more rows whose prefix has at least MIN_SHARED_PREFIX tokens run it once: up to
    `reward.batch_size` prefixes a forward, end to end in rows as wide as the longest (little padding), kept as a
    KV cache laid out as left-padded rows, copied to each response's row (`teacli.logprobs.on_prompt_cache`), and the responses' own
    tokens run on it, right-padded, in batches sorted by length and cut as above (counting each row's copy of its
    prefix); or, with `reward.pack_responses`, end to end in rows as training packs completions
    (`teacli.logprobs.on_packed_prompt_cache`); the score is read at each response's last token as before. Other rows (a lone
    response, a short common prefix, `score_texts`' rendered conversations) are scored whole. The scores are the
    unshared ones up to float rounding (tests/rewards/test_hf_shared.py). Whole conversations are scored instead
    where the cache does not apply (`sharing_problem`): a model tea does not pool itself, attention other than
    sdpa or eager (flash-attention, flex), a layer whose cache is not every past key and value (sliding-window,
    chunked or linear attention: Mistral's and Gemma 2/3's configs, hybrid and recurrent models), and compiled
    layers (`reward.kernels: compile`, which would compile again for the cache's shapes).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from teacli.models import encode_chat, is_standin, load_errors, looks_like_path, random_model, resolve_dtype
from teacli.logprobs import Packing, on_packed_prompt_cache, packing_problem
from teacli.padding import batch_sizes, packed_groups, packed_rows  # the forward batches' cut, which the planner prices too

if TYPE_CHECKING:
    import torch

    from teacli.config import RewardConfig
    from teacli.types import Prompt

log = logging.getLogger(__name__)

# A common prefix shorter than this (a lone BOS left by truncation) is not worth a pass of its own: its rows are scored whole.
MIN_SHARED_PREFIX = 8


class HFRewardModel:
    """A reward model: AutoModelForSequenceClassification (num_labels = 1) and its own tokenizer."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        batch_size: int = 16,
        max_length: int = 4096,
        name: str | None = None,
        share_prompts: bool = True,
        pack_responses: bool = False,
    ) -> None:
        import torch

        if batch_size < 1 or max_length < 2:
            raise ValueError(f"reward.batch_size / reward.max_length: got {batch_size} / {max_length}")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"reward.name_or_path: the tokenizer of reward model {name or '?'} has no chat template; "
                "a reward model must come with the template it was trained on"
            )
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id  # Llama RMs: needed to batch at all
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self.name = name or getattr(model.config, "_name_or_path", None) or type(model).__name__
        self.device = next(model.parameters()).device
        self.truncated = 0  # conversations cut to max_length so far
        self.tokens_scored = 0  # tokens of every conversation scored so far (benchmarks/phases.py: the phase's floor)
        self.tokens_run = 0  # tokens the model ran to score them: less than tokens_scored by the shared prefixes' repeats
        self.tokens_padded = 0  # padding its batches ran beside those: each batch's rows × its longest, less their lengths
        self._own_pooling = _is_generic_classifier(model) and isinstance(getattr(model, "score", None), torch.nn.Module)
        problem = None
        if share_prompts:
            problem = sharing_problem(model) if self._own_pooling else f"{type(model).__name__} runs its own forward"
        if problem:
            log.info("reward model %s: scoring whole conversations, not each prompt once (%s)", self.name, problem)
        # whether `score` runs a group's common prefix once (the module docstring); False: every conversation whole
        self.share_prompts = share_prompts and problem is None
        # whether the shared responses run packed, end to end in rows under a 4D mask (the module docstring)
        self.pack_responses = pack_responses and packing_problem(model) is None

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        revision: str | None = None,
        dtype: str = "auto",
        device: "str | torch.device | None" = None,
        batch_size: int = 16,
        max_length: int = 4096,
        trust_remote_code: bool = False,
        kernels: str = "auto",
        share_prompts: bool = True,
        pack_responses: bool = False,
    ) -> "HFRewardModel":
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        path = _local_or_hub(name_or_path)
        kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
        if revision:
            kwargs["revision"] = revision
        with load_errors("reward.name_or_path", name_or_path, path):
            tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
            if is_standin(path):  # a rehearsal: random weights of the reward model's shape
                model = random_model(path, "reward", resolve_dtype(dtype, device), device)
            else:
                model = AutoModelForSequenceClassification.from_pretrained(
                    path, num_labels=1, dtype=resolve_dtype(dtype, device), **kwargs
                )
        from teacli.kernels import apply_kernels, resolve_kernels

        model = model.to(device)
        kind = resolve_kernels(kernels, model, device, "reward.kernels")
        apply_kernels(model, kind, generates=False)
        if kind == "compile" and share_prompts:
            log.info("reward model %s: reward.kernels compile scores whole conversations (reward.share_prompts has no effect)", name_or_path)
        return cls(model, tokenizer, batch_size=batch_size, max_length=max_length, name=name_or_path,
                   share_prompts=share_prompts and kind != "compile", pack_responses=pack_responses)

    @classmethod
    def from_config(cls, cfg: "RewardConfig", device: "str | torch.device | None" = None) -> "HFRewardModel":
        """From the recipe's `reward:` section; `device` is the policy's (used when reward.device is 'auto')."""
        if not cfg.name_or_path:
            raise ValueError("reward.name_or_path: required when reward.kind is 'hf'")
        return cls.from_pretrained(
            cfg.name_or_path,
            revision=cfg.revision,
            dtype=cfg.dtype,
            device=device if cfg.device == "auto" else cfg.device,
            batch_size=cfg.batch_size,
            max_length=cfg.max_length,
            kernels=cfg.kernels,
            share_prompts=cfg.share_prompts,
            pack_responses=cfg.pack_responses,
        )

    # -- scoring ----------------------------------------------------------------------------------

    def encode(self, prompt: "Prompt", response: str) -> list[int]:
        """Token ids of [prompt messages..., assistant: response] under the RM's template, ≤ max_length."""
        ids = encode_chat(self.tokenizer, [*prompt.messages, {"role": "assistant", "content": response}], add_generation_prompt=False)
        return self._truncate(ids)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a conversation already rendered as text (OpenRLHF's `query`), no special tokens added."""
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise ValueError(f"reward model: a query of {len(text)} characters has no tokens to score")
        return self._truncate(ids)

    def _truncate(self, ids: list[int]) -> list[int]:
        if len(ids) <= self.max_length:
            return ids
        self.truncated += 1
        if self.truncated == 1:
            log.warning("reward model: a conversation of %d tokens was cut to reward.max_length=%d (keeping its end)", len(ids), self.max_length)
        bos = self.tokenizer.bos_token_id
        if bos is not None and ids[0] == bos:
            return [bos] + ids[len(ids) - self.max_length + 1 :]
        return ids[len(ids) - self.max_length :]

    def score(self, prompts: Sequence["Prompt"], responses: Sequence[str]) -> "torch.Tensor":
        """prompts[B], responses[B] → rewards[B] float32 on CPU: the RM's scalar logit per response."""
        if len(prompts) != len(responses):
            raise ValueError(f"reward model: {len(prompts)} prompts but {len(responses)} responses")
        return self._score_encoded([self.encode(p, r) for p, r in zip(prompts, responses)], [p.id for p in prompts])

    def score_texts(self, texts: Sequence[str]) -> "torch.Tensor":
        """texts[B] (whole conversations in the RM's chat format, as OpenRLHF clients send) → rewards[B]."""
        return self._score_encoded([self.encode_text(t) for t in texts])

    def _score_encoded(self, encoded: list[list[int]], keys: Sequence[str] | None = None) -> "torch.Tensor":
        """encoded[B] token ids → rewards[B] float32 on CPU, batched by length (the result does not depend on it).
        keys[B]: row b's prompt id; with `share_prompts`, the rows of one id that share a prefix run it once."""
        import torch

        self.tokens_scored += sum(len(ids) for ids in encoded)
        groups, alone = [], list(range(len(encoded)))
        if self.share_prompts and keys is not None:
            groups, alone = shared_prefixes(encoded, keys, MIN_SHARED_PREFIX)
        self.tokens_run += sum(len(encoded[i]) for i in alone) + sum(k + sum(len(encoded[r]) - k for r in rows) for rows, k in groups)
        if not groups:
            return score_by_length(self.model, encoded, self.batch_size, self._pack, self._forward)
        scores = torch.empty(len(encoded), dtype=torch.float32)
        if alone:
            scores[alone] = score_by_length(self.model, [encoded[i] for i in alone], self.batch_size, self._pack, self._forward)
        rows = [r for group, _ in groups for r in group]
        scores[rows] = self._score_shared(encoded, groups)
        return scores

    def _pack(self, batch: list[list[int]]) -> "tuple[torch.Tensor, torch.Tensor]":
        """batch[b] token ids → (input_ids, attention_mask) [b, L] on the host, right-padded."""
        self.tokens_padded += _pad_tokens(batch)
        return _padded(batch, self.tokenizer.pad_token_id, left=False)

    def _forward(self, input_ids: "torch.Tensor", mask: "torch.Tensor") -> "torch.Tensor":
        """A right-padded batch on the device → scores [b] float32 on the device, pooled at each row's last token.

        A decoder pooled by tea (`_own_pooling`) runs without the attention mask: attention is causal and the padding
        comes after every real token, so no real token sees it, and the forward takes the causal path (no mask to
        build, SDPA's flash kernel). Neither keeps a KV cache (a reward model's config may ask for one: it would hold
        every layer's keys and values until the forward returns, and a compiled forward recompiles on it)."""
        import torch

        if self._own_pooling:
            hidden = self.model.base_model(input_ids=input_ids, use_cache=False).last_hidden_state  # [b, L, H]
            last = mask.sum(dim=1) - 1  # [b]
            logits = self.model.score(hidden[torch.arange(len(input_ids), device=input_ids.device), last])  # [b, labels]
        else:
            logits = self.model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits  # [b, labels]
        return logits[:, 0].float()

    def _score_shared(self, encoded: list[list[int]], groups: list[tuple[list[int], int]]) -> "torch.Tensor":
        """The scores [R] float32 on CPU of the groups' rows, in the order of `groups` ((rows, k): rows sharing
        their first k tokens, every row longer than k).

        Up to batch_size groups make a block, longest prefixes first: the block's prefixes run in one forward
        (end to end in rows as wide as the longest, each attending causally within its own prefix: `_packed_prefixes`)
        into a KV cache, laid out as left-padded rows (`teacli.logprobs.unpacked_cache`); then its rows' remaining tokens, longest first, in the batches
        `batch_sizes` cuts (about batch_size rows a forward: more of the short ones, none holding more tokens with its
        prefixes than batch_size of the longest), each on its prefix's keys and values (copied to its row). A group split across batches
        keeps its one prefix pass, and only one block's cache is held at a time. Unlike whole conversations, a batch
        holds its keys and values for every layer while it runs: batch_size × (prefix + response) tokens × 2 × layers
        × KV heads × head size (the 8B Llama reward model: 128 KiB a token in bf16, 3 GiB for 16 rows of 1,536).
        Every tensor is packed before the first forward and the scores read back in one copy after the last, as in
        `score_by_length`."""
        import torch

        from teacli.logprobs import new_cache, on_prompt_cache, packed_mask, unpacked_cache

        pad, model = self.tokenizer.pad_token_id, self.model
        place = {r: i for i, r in enumerate(r for rows, _ in groups for r in rows)}  # row → its place in the result
        order = sorted(groups, key=lambda group: group[1], reverse=True)
        plan, done = [], []  # per block: (its packed prefixes, their left-padded mask, its batches); places scored
        for start in range(0, len(order), self.batch_size):
            block = order[start : start + self.batch_size]
            prefixes = [encoded[rows[0]][:k] for rows, k in block]
            _, prefix_mask = _padded(prefixes, pad, left=True)
            packed, padding = _packed_prefixes(prefixes, pad)  # end to end in rows: little padding
            self.tokens_padded += padding
            members = sorted(((r, u, k) for u, (rows, k) in enumerate(block) for r in rows),
                             key=lambda m: len(encoded[m[0]]) - m[2], reverse=True)  # longest remainder first
            cut = self._packed_batches if self.pack_responses else self._padded_batches
            batches = cut(encoded, members, len(block), prefix_mask.shape[1])
            done += [place[r] for batch in batches for r in batch[-1]]
            plan.append((packed, prefix_mask, [batch[:-1] for batch in batches]))
        plan = _to_device(plan, self.device)
        decoder = model.base_model

        def hidden_states(**inputs: Any) -> "torch.Tensor":
            return decoder(**inputs).last_hidden_state

        outs = []
        with _inference(model):
            for (prefix_ids, segment, at, index), prefix_mask, batches in plan:
                cache = new_cache(model)
                decoder(input_ids=prefix_ids, attention_mask=packed_mask(model, segment), position_ids=at,
                        past_key_values=cache, use_cache=True)
                unpacked_cache(cache, index)  # the prefixes' keys and values as left-padded rows [U, heads, Lp, d]
                for batch in batches:
                    if isinstance(batch[0], Packing):  # reward.pack_responses: rows [R, W, H], each response's last token
                        packing, ids, last = batch
                        hidden = on_packed_prompt_cache(hidden_states, model, cache, prefix_mask, packing, ids)
                        outs.append(model.score(hidden.reshape(-1, hidden.shape[-1])[last])[:, 0].float())
                        continue
                    row_of, ids, mask, last = batch
                    hidden = on_prompt_cache(hidden_states, model, cache, prefix_mask, row_of, ids, mask)  # [b, T, H]
                    outs.append(model.score(hidden[torch.arange(len(ids), device=ids.device), last])[:, 0].float())
                del cache
        scores = torch.empty(len(done), dtype=torch.float32)
        scores[done] = torch.cat(outs).cpu()
        return scores

    def _padded_batches(self, encoded: list[list[int]], members: list[tuple[int, int, int]], groups: int, wide: int) -> list[tuple]:
        """A block's responses right-padded: members (row, its prefix u in the block, k), longest remainder first, in
        the batches `batch_sizes` cuts. A row holds its prefix's keys and values too (`wide` columns): the cap counts
        them (a batch of short remainders may hold more rows, but no more tokens than batch_size of the longest with
        their prefixes). Each batch: (each row's prefix u [b], the remainders [b, T] and their mask, each one's last
        column [b], the rows it scores in that order)."""
        import torch

        batches, first = [], 0
        for size in batch_sizes([wide + len(encoded[r]) - k for r, _, k in members], self.batch_size):
            chunk, first = members[first : first + size], first + size
            rest = [encoded[r][k:] for r, _, k in chunk]
            self.tokens_padded += _pad_tokens(rest)
            ids, mask = _padded(rest, self.tokenizer.pad_token_id, left=False)
            batches.append((torch.tensor([u for _, u, _ in chunk]), ids, mask, torch.tensor([len(x) - 1 for x in rest]),
                            [r for r, _, _ in chunk]))
        return batches

    def _packed_batches(self, encoded: list[list[int]], members: list[tuple[int, int, int]], groups: int, wide: int) -> list[tuple]:
        """A block's responses packed (`reward.pack_responses`): members (row, its prefix u in the block, k), each
        row's remaining tokens encoded[row][k:] laid end to end in rows as wide as the block's longest remainder,
        a row holding one prefix's responses only (`teacli.padding.packed_groups`, first-fit decreasing), `batch_sizes`
        of those rows a forward (each as wide as the longest: batch_size rows, the unpacked batches' most tokens).
        Each batch: (its `Packing`, the remainders [b, T] it reads, each response's last place in [R × W], the rows
        it scores in that order)."""
        import torch

        widths = [len(encoded[r]) - k for r, _, k in members]
        cap = max(widths)
        laid = packed_groups(widths, ([i for i, (_, v, _) in enumerate(members) if v == u] for u in range(groups)), cap)
        batches, first = [], 0
        for size in batch_sizes([wide + cap] * len(laid), self.batch_size):
            chunk, first = laid[first : first + size], first + size
            seqs = [i for row in chunk for i in row]
            local = {i: j for j, i in enumerate(seqs)}
            rest = [encoded[members[i][0]][members[i][2]:] for i in seqs]
            spans = [len(x) for x in rest]
            self.tokens_padded += len(chunk) * cap - sum(spans)
            ids, _ = _padded(rest, self.tokenizer.pad_token_id, left=False)
            packing = Packing.lay([[local[i] for i in row] for row in chunk], spans, [members[i][1] for i in seqs],
                                  ids.shape[1], cap)
            last = packing.gather[torch.arange(len(seqs)), torch.tensor(spans) - 1]
            batches.append((packing, ids, last, [members[i][0] for i in seqs]))
        return batches


def _packed_prefixes(prefixes: list[list[int]], pad: int) -> "tuple[tuple[torch.Tensor, ...], int]":
    """A block's prefixes laid end to end in rows as wide as the longest (`teacli.padding.packed_rows`: first-fit
    decreasing; no row wider than left padding would make it, so attention costs no more), for one forward with
    little padding: ((ids [R, W] (pad at each row's end), each place's prefix [R, W] (−1 at padding), its position in
    its prefix [R, W], index [U, Lp]: the flat place in [R × W] of column j of prefix u left-padded to the longest,
    Lp = W; 0 where that is padding: `teacli.logprobs.unpacked_cache`), the padding computed)."""
    import torch

    lengths = [len(ids) for ids in prefixes]
    wide = max(lengths)
    rows = packed_rows(lengths, wide)
    laid = Packing.lay(rows, lengths, [0] * len(prefixes), wide, wide)
    ids = _padded(prefixes, pad, left=False)[0].reshape(-1)[laid.source].masked_fill(laid.segment < 0, pad)
    index = torch.zeros((len(prefixes), wide), dtype=torch.long)
    for u, n in enumerate(lengths):
        index[u, wide - n :] = laid.gather[u, :n]
    return (ids, laid.segment, laid.offset, index), len(rows) * wide - sum(lengths)


def shared_prefixes(
    encoded: list[list[int]], keys: Sequence[str], min_prefix: int,
) -> tuple[list[tuple[list[int], int]], list[int]]:
    """encoded[B] token ids, keys[B] (a row's prompt id) → (groups, alone): groups = (rows, k), the rows of one key
    that share their first k ≥ min_prefix tokens, k their longest common prefix less at least each row's last token
    (the one the score is read from); alone = every other row. Rows are grouped by key only to find candidates: k is
    the token sequences' own common prefix, so a key shared by different conversations costs nothing but a short k."""
    by_key: dict[str, list[int]] = {}
    for row, key in enumerate(keys):
        by_key.setdefault(key, []).append(row)
    groups, alone = [], []
    for rows in by_key.values():
        seqs = [encoded[r] for r in rows]
        lo, hi = min(seqs), max(seqs)  # lexicographic: every row's common prefix is these two's
        common = next((i for i, (a, b) in enumerate(zip(lo, hi)) if a != b), min(len(lo), len(hi)))
        k = min(common, min(len(x) for x in seqs) - 1)
        if len(rows) > 1 and k >= min_prefix:
            groups.append((rows, k))
        else:
            alone += rows
    return groups, sorted(alone)


def sharing_problem(model: Any) -> str | None:
    """Why `model`'s groups cannot run their common prefix once (None: they can): its attention is not sdpa or
    eager, whose masks tea's shared path is tested with, or a layer's cache is not a plain full-attention key/value
    cache (a sliding window keeps only the last keys, chunked attention its chunk, linear and recurrent layers a
    state), so the suffix would not see the whole prefix."""
    from teacli.logprobs import cache_problem

    attention = getattr(model.config, "_attn_implementation", None)
    if attention not in ("sdpa", "eager"):
        return f"attention {attention!r} (sdpa or eager share)"
    return cache_problem(model)


def _padded(rows: list[list[int]], pad: int, *, left: bool) -> "tuple[torch.Tensor, torch.Tensor]":
    """rows[b] token ids → (ids, mask) [b, L] on the host, padded on the left or the right."""
    import torch

    width = max(len(ids) for ids in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, x in enumerate(rows):
        cols = slice(width - len(x), width) if left else slice(0, len(x))
        ids[row, cols] = torch.tensor(x, dtype=torch.long)
        mask[row, cols] = 1
    return ids, mask


def _pad_tokens(rows: list[list[int]]) -> int:
    """The padding `_padded` adds to rows[b]: rows × the longest, less their lengths."""
    return len(rows) * max(map(len, rows)) - sum(map(len, rows))


def _to_device(tree: Any, device: "torch.device") -> Any:
    """Every tensor of nested lists/tuples on `device`: to a GPU from pinned memory without waiting."""
    import torch

    if isinstance(tree, torch.Tensor):
        return tree.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else tree.to(device)
    moved = [_to_device(x, device) for x in tree]
    return type(tree)(*moved) if hasattr(tree, "_fields") else type(tree)(moved)  # a NamedTuple (Packing) takes fields


@contextlib.contextmanager
def _inference(model: Any) -> "Iterator[None]":
    """`model` in eval mode under no_grad, its training flag restored after."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def score_by_length(
    model: Any, encoded: list[list[int]], batch_size: int,
    pack: "Callable[[list[list[int]]], tuple[torch.Tensor, ...]]", forward: "Callable[..., torch.Tensor]",
) -> "torch.Tensor":
    """encoded[B] token ids → forward's scores [B] float32 on CPU, in original order: sorted by length (longest
    first), in the batches `batch_sizes` cuts (about `batch_size` rows a forward of `pack`'s tensors), under no_grad
    with `model` in eval mode.

    Every batch is packed before the first forward and copied to a GPU from pinned memory without waiting, and the
    scores come back in one copy after the last: a copy from the host's pageable memory, like reading a value back,
    waits for the device to finish its queue, which once a batch left the GPU idle while the host built and launched
    the next."""
    import torch

    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]), reverse=True)
    batches, start = [], 0
    for size in batch_sizes([len(encoded[i]) for i in order], batch_size):
        batches.append(order[start : start + size])
        start += size
    packed = _to_device([pack([encoded[i] for i in rows]) for rows in batches], next(model.parameters()).device)
    scores = torch.empty(len(encoded), dtype=torch.float32)
    with _inference(model):
        outs = [forward(*tensors) for tensors in packed]
    if outs:
        scores[order] = torch.cat(outs).float().cpu()
    return scores


def _is_generic_classifier(model: Any) -> bool:
    try:
        from transformers.modeling_layers import GenericForSequenceClassification
    except ImportError:
        return False
    return isinstance(model, GenericForSequenceClassification)


def _local_or_hub(name: str) -> str:
    from pathlib import Path

    if looks_like_path(name) and not Path(name).expanduser().exists():
        raise ValueError(f"reward.name_or_path: no such directory {name!r}")
    return str(Path(name).expanduser()) if looks_like_path(name) else name
