"""`tea diagnose alignment`: oracle-gradient alignment of every advantage rule (paper appendix
"Oracle-gradient alignment diagnostic", Tab. `tab:gradient_alignment_mcurve_n128`, Fig.
`fig:mechanism_gradient_alignment`).

1. Pool: the first P prompts of the recipe's training split (after the prompt-length filter), K
   completions each from the recipe's policy (base, or `--checkpoint DIR`) with the recipe's rollout
   engine and sampling, scored by the recipe's reward. Stored in `OUT/pool.jsonl` one prompt per line
   (appended and fsynced per prompt: a killed run resumes at the next prompt; sampling is
   seed-deterministic per prompt); `OUT/pool.run.json` holds the settings, checked on resume.
2. Per-completion gradients: for the first `grad_prompts` pool prompts, ∇_θ log π(y_i|x) (the
   completion's summed token log-probs) on one block's parameters (default the last transformer
   block, as the paper's layer 15), KL off, no optimizer step. Every gradient the diagnostic needs is
   a combination G^T a of these K vectors, so only their Gram matrix G G^T [K, K] is kept
   (`OUT/gram/<i>.npy`, written atomically per prompt: resumable). Cosines follow exactly:
   cos(G^T a, G^T b) = a^T S b / √(a^T S a · b^T S b), S = G G^T.
3. Oracle: A*_N(r_i) = E[max(r_i, M_{N−1})] − E[M_N] under the prompt's empirical pool distribution
   (M_k the maximum of k draws), exactly from the empirical CDF (`oracle_advantages`); g*_N = G^T A*.
4. For each seed, m and rule: m of the K completions per prompt, drawn without replacement
   (seeded by (seed, prompt, m), the same subsample for every rule), the rule's advantages on their
   rewards, g(A) = Σ_i A_i ∇log π(y_i|x) on the subsample, cos(g(A), g*_N) per prompt. alignment.json:
   {rule: {m: {"mean", "sem"}}} over the prompt × seed cosines (sem = sample std / √count); a rule that
   cannot use an m (a ValueError from the rule: too small a group for its tail or prefix plan) gets
   {"mean": null, "sem": null, "skipped": reason}; a zero gradient (all advantages 0) gives no cosine
   and is counted in "undefined".

Per-m parameters as in the paper: BoN mean k = ⌊m/2⌋, Chow n_sel = ⌊m/2⌋, m_corr = m − ⌊m/2⌋,
CAT-BoN and TEA/Prefix-TEA n_target = N. The rule `oracle` is the plug-in oracle on the subsample
(A*_N under the subsample's own empirical distribution); with m = K it reproduces g*_N (cosine 1).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    import numpy as np

    from teacli.config import Recipe

DEFAULT_PROMPTS = 128
DEFAULT_POOL = 512
DEFAULT_GRAD_PROMPTS = 32
DEFAULT_SEEDS = 5
DEFAULT_N = 128
DEFAULT_MS = (16, 24, 32, 48, 64, 96)
DEFAULT_RULES = ("grpo", "tea", "bon_max_mean", "bon_max_second", "bon_mean", "chow", "cat_bon", "grpo_z", "prefix_tea")
LABELS = {
    "grpo": "GRPO", "grpo_z": "GRPO-Z", "tea": "TEA", "tea_raw": "TEA (raw)", "prefix_tea": "Prefix-TEA",
    "bon_max_mean": "BoN-max mean", "bon_max_second": "BoN-max second", "bon_mean": "BoN mean",
    "chow": "Chow BoN-RL", "cat_bon": "CAT-BoN", "oracle": "Oracle (plug-in)",
}
Progress = Callable[[str, int, int], None]  # (stage, done, total)


class AlignmentError(ValueError):
    """A problem with the inputs or the output directory, naming the flag, key or file."""


# ------------------------------------------------------------------------------------------------
# The exact oracle advantage


def oracle_advantages(rewards: "np.ndarray", N: int, support: "np.ndarray | None" = None) -> "np.ndarray":
    """A*_N(r) = E[max(r, M_{N−1})] − E[M_N] for each r in `rewards`, M_k the maximum of k i.i.d. draws
    from the empirical distribution of `support` (default: `rewards` itself). Exact, from the CDF:
    with distinct support values v_1 < … < v_L and F_j = #{s ≤ v_j}/K, P(M_k = v_j) = F_j^k − F_{j−1}^k.
    """
    import numpy as np

    r = np.asarray(rewards, dtype=np.float64)
    s = np.asarray(r if support is None else support, dtype=np.float64)
    if int(N) != N or N < 1:
        raise ValueError(f"oracle advantage: N must be an integer >= 1, got {N!r}")
    if N == 1:  # M_0 does not exist: A*_1(r) = r − E[R]
        return r - s.mean()
    values, counts = np.unique(s, return_counts=True)
    F = np.cumsum(counts) / s.size
    F_prev = np.concatenate([[0.0], F[:-1]])
    p_n = F**N - F_prev**N  # P(M_N = v_j)
    p_n1 = F ** (N - 1) - F_prev ** (N - 1)  # P(M_{N−1} = v_j)
    e_max_n = float(p_n @ values)
    # E[max(r, M_{N−1})] = r·P(M ≤ r) + Σ_{v_j > r} v_j P(M = v_j)
    above = np.cumsum((p_n1 * values)[::-1])[::-1]  # above[j] = Σ_{i ≥ j} v_i p_i
    above = np.concatenate([above, [0.0]])
    j = np.searchsorted(values, r, side="right")  # first support index with v > r
    cdf_at_r = np.where(j > 0, F[np.maximum(j - 1, 0)] ** (N - 1), 0.0)
    return r * cdf_at_r + above[j] - e_max_n


# ------------------------------------------------------------------------------------------------
# Rules per m


def rule_params(rule: str, m: int, N: int) -> dict[str, Any]:
    """The paper's per-m parameters of each rule (appendix, below Tab. `tab:gradient_alignment_mcurve_n128`)."""
    if rule == "bon_mean":
        return {"k": m // 2}
    if rule == "chow":
        return {"n_sel": m // 2, "m_corr": m - m // 2}
    if rule in ("cat_bon", "tea", "tea_raw", "prefix_tea"):
        return {"n_target": N}
    return {}


def rule_advantages(rule: str, rewards: "np.ndarray", N: int, seed: int) -> "np.ndarray":
    """Advantages [P, m] of `rule` on rewards [P, m]; ValueError where the rule cannot use this m."""
    import numpy as np
    import torch

    from teacli.advantages import compute_advantages

    if rule == "oracle":
        return np.stack([oracle_advantages(row, N) for row in rewards])
    m = rewards.shape[1]
    params = rule_params(rule, m, N)
    if rule == "chow":
        params["generator"] = torch.Generator().manual_seed(int(seed))
    return compute_advantages(rule, torch.from_numpy(np.asarray(rewards, dtype=np.float64)), **params).double().numpy()


def check_rules(rules: Sequence[str]) -> None:
    from teacli.advantages import resolve_rule

    for rule in rules:
        if rule == "oracle":
            continue
        try:
            resolve_rule(rule)
        except ValueError as exc:
            raise AlignmentError(f"--rules: {exc}") from None


# ------------------------------------------------------------------------------------------------
# Cosines from Gram matrices


def cosine(S: "np.ndarray", a: "np.ndarray", b: "np.ndarray") -> float | None:
    """cos(G^T a, G^T b) from S = G G^T; None when either vector is zero."""
    import numpy as np

    aa, bb = float(a @ S @ a), float(b @ S @ b)
    if aa <= 0.0 or bb <= 0.0 or not np.isfinite(aa * bb):
        return None
    return float(np.clip((a @ S @ b) / math.sqrt(aa * bb), -1.0, 1.0))


def subsample(K: int, m: int, seed: int, prompt_index: int) -> "np.ndarray":
    import numpy as np

    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(prompt_index), int(m), 7]))
    return rng.choice(K, size=m, replace=False)


def alignment_table(grams: Sequence["np.ndarray"], rewards: Sequence["np.ndarray"], rules: Sequence[str], ms: Sequence[int],
                    N: int, seeds: int, progress: Callable[[int], None] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """{rule: {str(m): {"mean", "sem", "count", "undefined"} or {"mean": None, "sem": None, "skipped": why}}}."""
    import numpy as np

    K = len(rewards[0])
    oracle = [oracle_advantages(r, N) for r in rewards]
    out: dict[str, dict[str, dict[str, Any]]] = {rule: {} for rule in rules}
    for m in ms:
        if m > K:
            raise AlignmentError(f"--m {m}: larger than the pool's {K} completions per prompt (--pool)")
        idx = [[subsample(K, m, s, p) for p in range(len(rewards))] for s in range(seeds)]
        for rule in rules:
            values: list[float] = []
            undefined = 0
            skipped = None
            for s in range(seeds):
                sub = np.stack([rewards[p][idx[s][p]] for p in range(len(rewards))])
                try:
                    adv = rule_advantages(rule, sub, N, seed=1_000_003 * s + m)
                except ValueError as exc:
                    skipped = str(exc)
                    break
                for p, S in enumerate(grams):
                    a = np.zeros(K)
                    a[idx[s][p]] = adv[p]
                    c = cosine(S, a, oracle[p])
                    if c is None:
                        undefined += 1
                    else:
                        values.append(c)
            if skipped is not None:
                out[rule][str(m)] = {"mean": None, "sem": None, "skipped": skipped}
            else:
                arr = np.asarray(values)
                out[rule][str(m)] = {
                    "mean": float(arr.mean()) if arr.size else None,
                    "sem": float(arr.std(ddof=1) / math.sqrt(arr.size)) if arr.size > 1 else None,
                    "count": int(arr.size),
                    "undefined": undefined,
                }
            if progress:
                progress(1)
    return out


# ------------------------------------------------------------------------------------------------
# The block and per-completion gradients


def find_block(model: Any, block: str) -> tuple[str, list[tuple[str, Any]]]:
    """(prefix, [(name, parameter)]) of the chosen block: an index into the model's transformer layers
    (the longest nn.ModuleList: `-1` = the last block) or a parameter-name prefix."""
    import torch

    params = list(model.named_parameters())
    text = block.strip()
    if text.lstrip("-").isdigit():
        lists = [(n, mod) for n, mod in model.named_modules() if isinstance(mod, torch.nn.ModuleList) and len(mod)]
        if not lists:
            raise AlignmentError(f"--block {block}: the model has no list of transformer layers; give a parameter-name prefix")
        name, layers = max(lists, key=lambda x: len(x[1]))
        i = int(text)
        if not -len(layers) <= i < len(layers):
            raise AlignmentError(f"--block {block}: the model has {len(layers)} blocks ({name}.0 … {name}.{len(layers) - 1})")
        prefix = f"{name}.{i % len(layers)}."
    else:
        prefix = text if text.endswith(".") else text + "."
    chosen = [(n, p) for n, p in params if n.startswith(prefix)]
    if not chosen:
        raise AlignmentError(f"--block {block}: no parameter of the policy starts with {prefix!r}")
    return prefix.rstrip("."), chosen


def block_parameters(model: Any, block: str) -> tuple[str, list[tuple[str, Any]]]:
    """`find_block`, with requires_grad on for the block's parameters and off for every other one (only the
    block and what lies above it are then on the autograd graph)."""
    name, chosen = find_block(model, block)
    names = {n for n, _ in chosen}
    for n, p in model.named_parameters():
        p.requires_grad_(n in names)
    return name, chosen


def _per_sample_plan(model: Any, params: list[Any]) -> list[tuple[Any, str, int]] | None:
    """[(module, kind, index into params)] when every chosen parameter belongs to a module whose
    per-completion gradient follows from its input and output gradient (a Linear's weight or bias, an
    RMSNorm's scale); None otherwise (the per-completion backward loop is used then)."""
    import torch

    index = {id(p): i for i, p in enumerate(params)}
    plan, seen = [], set()
    for _, module in model.named_modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) not in index or id(p) in seen:
                continue
            if isinstance(module, torch.nn.Linear):
                kind = "linear_weight" if name == "weight" else "linear_bias"
            elif "RMSNorm" in type(module).__name__ and name == "weight" and p.dim() == 1:
                kind = "rms_scale"
            else:
                return None
            seen.add(id(p))
            plan.append((module, kind, index[id(p)]))
    return plan if len(seen) == len(params) else None


def _rms_normed(module: Any, x: Any) -> Any:
    """The RMSNorm's normalized input (what its scale multiplies), in float32."""
    import torch

    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + float(eps if eps is not None else 1e-6))


def _batched_gradients(model: Any, params: list[Any], plan: list[tuple[Any, str, int]], input_ids: Any, attn: Any,
                       lp: int, cmask: Any) -> "Any | None":
    """[B, D] per-completion gradients from ONE forward and ONE backward of the micro-batch: the rows
    are independent (no attention across them), so the gradient of sum_b log π(y_b|x) with respect to
    a module's output holds each completion's own output gradient, and a Linear's weight gradient is
    Σ_t g_t x_tᵀ per row (its bias Σ_t g_t, an RMSNorm's scale Σ_t g_t ⊙ x̂_t). None when a check fails:
    a module called twice, an RMSNorm whose output is not its normalized input times w (or 1 + w), or
    the rows' sum differing from the batch's gradient (relative 1e-4)."""
    import torch

    from teacli.logprobs import token_logprobs

    B = input_ids.shape[0]
    seen: dict[int, list[tuple[Any, Any]]] = {}
    grads_out: dict[int, list[Any]] = {}
    handles = []

    def on_forward(module: Any, inputs: tuple, output: Any) -> None:
        key = id(module)
        seen.setdefault(key, []).append((inputs[0].detach(), output.detach()))
        if output.requires_grad:
            output.register_hook(lambda g, key=key: grads_out.setdefault(key, []).append(g.detach()))

    modules = {id(m): m for m, _, _ in plan}
    try:
        for m in modules.values():
            handles.append(m.register_forward_hook(on_forward))
        logp = token_logprobs(model, input_ids, attn, lp)
        total = (logp * cmask).sum()
        batch_grads = torch.autograd.grad(total, params, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    if any(len(seen.get(k, [])) != 1 or len(grads_out.get(k, [])) != 1 for k in modules):
        return None
    pieces: list[Any] = [None] * len(params)
    for module, kind, i in plan:
        (x, out), g = seen[id(module)][0], grads_out[id(module)][0].float()
        g2 = g.reshape(B, -1, g.shape[-1])
        if kind == "linear_weight":
            pieces[i] = torch.einsum("bno,bni->boi", g2, x.float().reshape(B, -1, x.shape[-1])).reshape(B, -1)
        elif kind == "linear_bias":
            pieces[i] = g2.sum(dim=1)
        else:
            normed = _rms_normed(module, x)
            w = module.weight.detach().float()
            if not any(torch.allclose(out.float(), normed * scale, rtol=1e-4, atol=1e-5) for scale in (w, 1.0 + w)):
                return None
            pieces[i] = (g2 * normed.reshape(B, -1, normed.shape[-1])).sum(dim=1)
    G = torch.cat(pieces, dim=1)
    whole = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).float() for g, p in zip(batch_grads, params)])
    if (G.sum(dim=0) - whole).norm() > 1e-4 * max(whole.norm().item(), 1e-12):
        return None
    return G


def completion_gradients(model: Any, params: list[Any], prompt_ids: list[int], completions: list[list[int]],
                         pad_id: int, batch_size: int, device: Any, tick: Callable[[int], None] | None = None,
                         method: str = "auto", log: Callable[[str], None] = lambda m: None) -> "Any":
    """G [K, D] (a float32 tensor on `device`): ∇ log π(y_i|x) on `params` (flattened) for each completion.

    method "batched" (what "auto" picks when every parameter of the block is a Linear's or an RMSNorm's,
    as in every decoder layer of Llama, Qwen, Mistral or Gemma): one forward and one backward per
    micro-batch, the per-completion gradients from each module's input and output gradient
    (`_batched_gradients`, checked against the batch's gradient). method "loop" (and "auto"
    otherwise, or when a check fails): one forward per micro-batch, one backward per completion (only
    the layers from the block upward are on the graph: every other parameter has requires_grad off).
    """
    import torch

    from teacli.logprobs import token_logprobs

    plan = _per_sample_plan(model, params) if method in ("auto", "batched") else None
    if method == "batched" and plan is None:
        raise AlignmentError("batched gradients need every block parameter to be a Linear's or an RMSNorm's")
    D = sum(p.numel() for p in params)
    G = torch.empty((len(completions), D), dtype=torch.float32, device=device)
    lp = len(prompt_ids)
    for start in range(0, len(completions), batch_size):
        chunk = completions[start:start + batch_size]
        tc = max(1, max(len(c) for c in chunk))
        input_ids = torch.full((len(chunk), lp + tc), pad_id, dtype=torch.long)
        attn = torch.zeros_like(input_ids)
        cmask = torch.zeros((len(chunk), tc), dtype=torch.float32)
        input_ids[:, :lp] = torch.tensor(prompt_ids, dtype=torch.long)
        attn[:, :lp] = 1
        for b, c in enumerate(chunk):
            if c:
                input_ids[b, lp:lp + len(c)] = torch.tensor(c, dtype=torch.long)
                attn[b, lp:lp + len(c)] = 1
                cmask[b, :len(c)] = 1.0
        input_ids, attn, cmask = input_ids.to(device), attn.to(device), cmask.to(device)
        if plan is not None:
            rows = _batched_gradients(model, params, plan, input_ids, attn, lp, cmask)
            if rows is not None:
                G[start:start + len(chunk)] = rows
                if tick:
                    tick(len(chunk))
                continue
            if method == "batched":
                raise AlignmentError("batched gradients failed their check against the batch's gradient")
            log("gradients: the batched per-completion gradients failed their check; one backward per completion for the rest "
                "of these completions (the next prompt's, or row block's, try the batched way again)")
            plan = None
        logp = token_logprobs(model, input_ids, attn, lp)
        seq = (logp * cmask).sum(dim=1)
        for b in range(len(chunk)):
            grads = torch.autograd.grad(seq[b], params, retain_graph=b < len(chunk) - 1, allow_unused=True)
            G[start + b] = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).float() for g, p in zip(grads, params)])
            if tick:
                tick(1)
    return G


def gram_matrix(grads: Callable[[list[int]], Any], K: int, rows_per_block: int) -> "np.ndarray":
    """S = G G^T [K, K] in float64 from `grads(rows)` → G[rows] (a tensor), holding at most two row
    blocks of G at once: with K ≤ rows_per_block one pass; otherwise block pairs (I, J ≥ I) and the
    gradients of later blocks computed again for each earlier one."""
    import numpy as np
    import torch

    def dot(a: Any, b: Any) -> Any:
        out = torch.zeros((a.shape[0], b.shape[0]), dtype=torch.float64, device=a.device)
        for c in range(0, a.shape[1], 1 << 20):  # float64 accumulation, bounded temporary memory
            out += a[:, c:c + (1 << 20)].double() @ b[:, c:c + (1 << 20)].double().T
        return out

    blocks = [list(range(i, min(K, i + rows_per_block))) for i in range(0, K, rows_per_block)]
    S = np.zeros((K, K))
    for bi, I in enumerate(blocks):
        GI = grads(I)
        S[np.ix_(I, I)] = dot(GI, GI).cpu().numpy()
        for J in blocks[bi + 1:]:
            GJ = grads(J)
            SIJ = dot(GI, GJ).cpu().numpy()
            S[np.ix_(I, J)] = SIJ
            S[np.ix_(J, I)] = SIJ.T
            del GJ
        del GI
    return S


# ------------------------------------------------------------------------------------------------
# Files: pool.jsonl, pool.run.json, gram/<i>.npy, alignment.json, tables, plot


def _atomic_bytes(path: Path, write: Callable[[Any], None]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _prompt_seed(seed: int, prompt_id: str) -> int:
    digest = hashlib.sha256(f"alignment:{seed}:{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (2**31 - 1)


def read_pool(path: Path) -> list[dict[str, Any]]:
    """Complete lines of pool.jsonl (a torn last line from a kill is cut off)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
    out = []
    for lineno, line in enumerate(data[:end].decode("utf-8").split("\n")[:-1], 1):
        try:
            rec = json.loads(line)
            assert isinstance(rec["prompt_id"], str) and isinstance(rec["completions"], list)
        except (ValueError, KeyError, TypeError, AssertionError):
            raise AlignmentError(f"{path}:{lineno}: not a pool record; move the file away to sample the pool again") from None
        out.append(rec)
    return out


@dataclasses.dataclass
class Settings:
    recipe: "Recipe"
    out: Path
    checkpoint: Path | None = None
    prompts: int = DEFAULT_PROMPTS
    pool: int = DEFAULT_POOL
    grad_prompts: int | None = None  # None: DEFAULT_GRAD_PROMPTS, at most `prompts`
    ms: tuple[int, ...] = DEFAULT_MS
    N: int = DEFAULT_N
    seeds: int = DEFAULT_SEEDS
    rules: tuple[str, ...] = DEFAULT_RULES
    block: str = "-1"
    split: str | None = None
    grad_batch_size: int = 8
    grad_memory_gib: float = 8.0

    def __post_init__(self) -> None:
        if self.grad_prompts is None:
            self.grad_prompts = min(DEFAULT_GRAD_PROMPTS, self.prompts)

    def check(self) -> None:
        for flag, value in (("--prompts", self.prompts), ("--pool", self.pool), ("--grad-prompts", self.grad_prompts),
                            ("--seeds", self.seeds), ("--n", self.N), ("--grad-batch-size", self.grad_batch_size)):
            if value < 1:
                raise AlignmentError(f"{flag} {value}: must be >= 1")
        if self.grad_prompts > self.prompts:
            raise AlignmentError(f"--grad-prompts {self.grad_prompts}: larger than --prompts {self.prompts}")
        if self.pool < 2:
            raise AlignmentError(f"--pool {self.pool}: a pool needs at least 2 completions per prompt")
        if not self.ms:
            raise AlignmentError("--m: give at least one rollout budget")
        for m in self.ms:
            if m < 2 or m > self.pool:
                raise AlignmentError(f"--m {m}: each m must lie in 2 … --pool ({self.pool})")
        if not self.rules:
            raise AlignmentError("--rules: give at least one rule")
        check_rules(self.rules)
        if self.checkpoint is not None and not (self.checkpoint / "config.json").is_file():
            raise AlignmentError(f"--checkpoint {self.checkpoint}: not a model checkpoint directory (no config.json)")
        if self.out.exists() and not self.out.is_dir():
            raise AlignmentError(f"--out {self.out}: is a file; give a directory")

    def pool_settings(self) -> dict[str, Any]:
        from teacli.rollout.base import sampling_settings

        r = self.recipe
        return {
            "policy": r.policy.name_or_path, "gguf_file": r.policy.gguf_file,
            "checkpoint": None if self.checkpoint is None else str(self.checkpoint.resolve()),
            "data_dir": r.data.dir, "split": self.split or r.data.train_split, "prompts": self.prompts, "pool": self.pool,
            "seed": r.seed, "sampling": sampling_settings(r.rollout),
            "reward": r.reward.settings(), "max_prompt_tokens": r.data.max_prompt_tokens,
        }


def _policy_cfg(s: Settings) -> Any:
    from teacli.session import policy_config

    return policy_config(s.recipe.policy, s.checkpoint)


def run_alignment(s: Settings, progress: Progress | None = None, log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Sample (or resume) the pool, compute (or resume) the Gram matrices, write every output; returns alignment.json's object."""
    import numpy as np
    import torch

    from teacli import models
    from teacli.data.load import load_split
    from teacli.session import Sampler, encode_prompts, open_tokenizer

    s.check()
    policy_cfg = _policy_cfg(s)
    try:
        tokenizer = open_tokenizer(policy_cfg, s.recipe.rollout.stop_tokens)  # before anything is written
    except ValueError as exc:
        raise AlignmentError(str(exc)) from None
    s.out.mkdir(parents=True, exist_ok=True)
    recipe = s.recipe
    settings = s.pool_settings()
    settings_path = s.out / "pool.run.json"
    if settings_path.exists():
        from teacli.config import applicable

        # the reward's keys its kind does not read (config.APPLIES_WHEN: reward.kernels of a rule reward) made no other pool
        old, now = applicable(json.loads(settings_path.read_text())), applicable(settings)
        diff = sorted(k for k in set(old) | set(now) if old.get(k) != now.get(k))
        if diff:
            raise AlignmentError(f"{settings_path}: the stored pool was made with other settings ({', '.join(diff)}); "
                                 "use another --out or move that directory away")
    else:
        _atomic_bytes(settings_path, lambda f: f.write((json.dumps(settings, indent=2) + "\n").encode()))

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    split = s.split or recipe.data.train_split
    prompts, _ = encode_prompts(tokenizer, load_split(recipe.data.dir, split), recipe.data.max_prompt_tokens, limit=s.prompts)
    if len(prompts) < s.prompts:
        raise AlignmentError(f"--prompts {s.prompts}: split {split!r} of {recipe.data.dir} has only {len(prompts)} prompts "
                             f"within data.max_prompt_tokens={recipe.data.max_prompt_tokens}")

    pool_path = s.out / "pool.jsonl"
    pool = read_pool(pool_path)
    order = [p.id for p, _ in prompts]
    if [r["prompt_id"] for r in pool] != order[:len(pool)]:
        raise AlignmentError(f"{pool_path}: holds other prompts than split {split!r} gives now; move it away")
    model = None
    if len(pool) < s.prompts:
        log(f"pool: {len(pool)} of {s.prompts} prompts on disk; sampling {s.pool} completions for each of the rest")
        sampler = Sampler.open(recipe, policy_cfg, tokenizer, device, dtype=torch.float32)
        model = sampler.model
        if progress:
            progress("pool", len(pool), s.prompts)
        for i in range(len(pool), s.prompts):
            prompt, ids = prompts[i]
            (group,) = sampler.generate([ids], s.pool, _prompt_seed(recipe.seed, prompt.id))
            scores = sampler.score(prompt, [c.text for c in group])
            line = {"prompt_id": prompt.id, "prompt_token_ids": list(ids),
                    "completions": [{"token_ids": list(c.token_ids), "text": c.text, "reward": float(r)} for c, r in zip(group, scores)]}
            with open(pool_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
            pool.append(line)
            if progress:
                progress("pool", i + 1, s.prompts)
        sampler.close()
    used = pool[: s.grad_prompts]
    rewards = [np.array([c["reward"] for c in rec["completions"]], dtype=np.float64) for rec in used]

    gram_dir = s.out / "gram"
    gram_dir.mkdir(exist_ok=True)
    grad_key = {"block": s.block, "grad_prompts": s.grad_prompts}
    key_path = gram_dir / "settings.json"
    stored = json.loads(key_path.read_text()) if key_path.exists() else {}
    if stored and {k: stored.get(k) for k in grad_key} != grad_key:
        for old in gram_dir.glob("*.npy"):
            old.unlink()
        stored = {}
        log("gradients: --block or --grad-prompts changed; computing the Gram matrices again")
    grams: list[Any] = [None] * len(used)
    for i in range(len(used)):
        path = gram_dir / f"{i:05d}.npy"
        if path.exists():
            grams[i] = np.load(path)
    todo = [i for i, g in enumerate(grams) if g is None]
    block_name, n_params = stored.get("block_name"), stored.get("block_parameters")
    if model is None and (todo or block_name is None):
        model = models.load_policy(policy_cfg, dtype=torch.float32, device=device).eval()
    if model is not None:
        block_name, chosen = block_parameters(model, s.block)  # the block trainable, every other parameter frozen
        n_params = sum(p.numel() for _, p in chosen)
        record = {**grad_key, "block_name": block_name, "block_parameters": n_params}
        _atomic_bytes(key_path, lambda f: f.write(json.dumps(record).encode()))
    if todo:
        assert model is not None
        params = [p for _, p in chosen]
        how = (f"one backward per {s.grad_batch_size} completions, each completion's gradient from the block's Linear and RMSNorm "
               f"inputs and output gradients" if _per_sample_plan(model, params) is not None
               else f"{s.pool} backward passes each")
        log(f"gradients: block {block_name} ({n_params:,} parameters), {len(todo)} of {len(used)} prompts to do ({how})")
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        # Two row blocks of G are held at once (float32).
        rows_per_block = max(1, int(s.grad_memory_gib * 2**30 // (2 * 4 * n_params)))
        blocks = -(-s.pool // rows_per_block)
        if blocks > 1:
            log(f"gradients: {s.pool} x {n_params:,} floats exceed --grad-memory {s.grad_memory_gib} GiB; Gram matrix in "
                f"{blocks} row blocks (gradients of block b computed b times)")
        per_prompt = sum((min(s.pool, (b + 1) * rows_per_block) - b * rows_per_block) * (b + 1) for b in range(blocks))
        total = len(used) * per_prompt
        done = (len(used) - len(todo)) * per_prompt
        if progress:
            progress("gradients", done, total)

        def tick(k: int) -> None:
            nonlocal done
            done += k
            if progress:
                progress("gradients", done, total)

        for i in todo:
            rec = used[i]
            comps = [c["token_ids"] for c in rec["completions"]]

            def grads(rows: list[int], rec: dict[str, Any] = rec, comps: list[list[int]] = comps) -> Any:
                return completion_gradients(model, params, rec["prompt_token_ids"], [comps[r] for r in rows],
                                            pad_id, s.grad_batch_size, device, tick, log=log)

            S = gram_matrix(grads, s.pool, rows_per_block)
            _atomic_bytes(gram_dir / f"{i:05d}.npy", lambda f: np.save(f, S))
            grams[i] = S

    n_cells = len(s.ms) * len(s.rules)
    finished = 0

    def cell(k: int) -> None:
        nonlocal finished
        finished += k
        if progress:
            progress("cosines", finished, n_cells)

    table = alignment_table(grams, rewards, s.rules, s.ms, s.N, s.seeds, cell)
    meta = {"block": block_name, "block_parameters": n_params, "prompts": s.prompts, "pool": s.pool,
            "grad_prompts": len(used), "seeds": s.seeds, "N": s.N, "m": list(s.ms), "rules": list(s.rules),
            "checkpoint": settings["checkpoint"], "policy": settings["policy"], "split": settings["split"]}
    write_outputs(table, meta, s.out)
    return table


def public(table: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """alignment.json: {rule: {m: {"mean", "sem"}}} (+ "skipped" where the rule cannot use that m)."""
    return {rule: {m: {k: v for k, v in c.items() if k in ("mean", "sem", "skipped")} for m, c in row.items()}
            for rule, row in table.items()}


def skipped_notes(table: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """One line per rule that could not use some budgets m, with the reason of the first."""
    lines = []
    for rule, row in table.items():
        skipped = [m for m, c in row.items() if c.get("skipped")]
        if skipped:
            lines.append(f"{rule}: skipped at m = {', '.join(skipped)} ({row[skipped[0]]['skipped']})")
    return lines


def tables(table: dict[str, dict[str, dict[str, Any]]], meta: dict[str, Any]) -> list:
    from teacli.tables import Table

    ms = meta["m"]
    caption = (f"Actual-gradient cosine similarity to the empirical expected-best-of-{meta['N']} oracle gradient as the "
               f"rollout budget m varies; block {meta['block']} ({meta['block_parameters']:,} parameters); averaged over "
               f"{meta['grad_prompts']} prompts and {meta['seeds']} seeds (pool: {meta['prompts']} prompts x {meta['pool']} "
               "completions); – = the rule cannot use this m")
    t = Table("alignment", caption, ["Method", *[f"m={m}" for m in ms]])
    sem = Table("alignment_sem", "Standard error of each mean in the alignment table (over the prompt x seed cosines)",
                ["Method", *[f"m={m}" for m in ms]])
    for rule, row in table.items():
        t.rows.append([LABELS.get(rule, rule), *[row[str(m)]["mean"] for m in ms]])
        sem.rows.append([LABELS.get(rule, rule), *[row[str(m)]["sem"] for m in ms]])
    return [t, sem]


def plot(table: dict[str, dict[str, dict[str, Any]]], meta: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.6, 4.4), layout="constrained")
    rules = [rule for rule, row in table.items() if any(c["mean"] is not None for c in row.values())]
    for i, rule in enumerate(rules):
        pts = sorted((int(m), c["mean"], c["sem"] or 0.0) for m, c in table[rule].items() if c["mean"] is not None)
        ms, means, sems = zip(*pts)
        # Each rule a little to the side (a fraction of an octave): rules whose cosines coincide (GRPO and
        # GRPO-Z on some pools) stay visible instead of one hiding the other.
        dodge = 2 ** (0.025 * (i - (len(rules) - 1) / 2))
        ax.errorbar([m * dodge for m in ms], means, yerr=sems, marker="o", markersize=3, capsize=2,
                    label=LABELS.get(rule, rule), linewidth=2.0 if rule == "tea" else 1.0)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(meta["m"]), [str(m) for m in meta["m"]])
    ax.minorticks_off()
    ax.set_xlabel("rollout budget m")
    ax.set_ylabel(f"cosine to the best-of-{meta['N']} oracle gradient")
    ax.set_title(f"Oracle-gradient alignment (best-of-{meta['N']}; mean ± s.e. over prompts × seeds)", fontsize="medium")
    ax.grid(True, alpha=0.3)
    fig.legend(loc="outside right center", fontsize="small")  # beside the axes: no curve is hidden
    fig.savefig(path, dpi=150)
    plt.close(fig)


def write_outputs(table: dict[str, dict[str, dict[str, Any]]], meta: dict[str, Any], out: Path) -> list[Path]:
    from teacli.tables import csv_text, latex, markdown
    from teacli.rundir import write_text_atomic

    written = [out / "alignment.json", out / "alignment.run.json"]
    write_text_atomic(written[0], json.dumps(public(table), indent=2) + "\n")
    write_text_atomic(written[1], json.dumps({**meta, "details": table}, indent=2) + "\n")
    for t in tables(table, meta):
        for suffix, text in ((".md", markdown(t)), (".tex", latex(t, "tab:tea_diagnose_")), (".csv", csv_text(t))):
            write_text_atomic(out / f"{t.name}{suffix}", text)
            written.append(out / f"{t.name}{suffix}")
    tmp = out / ".alignment.tmp.png"
    plot(table, meta, tmp)
    tmp.replace(out / "alignment.png")
    return written + [out / "alignment.png"]
