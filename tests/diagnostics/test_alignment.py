"""`tea diagnose alignment`: the exact oracle advantage, cosines from Gram matrices, the CLI on a tiny model."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from tiny_lm import tea_env, tiny_recipe, write_recipe  # noqa: E402

from teacli.diagnostics import alignment as AL  # noqa: E402


@pytest.mark.parametrize("N", [1, 2, 3, 4])
def test_oracle_advantage_by_enumeration(N):
    support = np.array([0.0, 1.0, 1.0, 3.0])  # a tie included
    # E[M_N] and E[max(r, M_{N-1})] by enumerating every equally likely draw sequence.
    e_max_n = np.mean([max(t) for t in itertools.product(support, repeat=N)])
    expected = []
    for r in support:
        if N == 1:
            e = r
        else:
            e = np.mean([max(r, *t) for t in itertools.product(support, repeat=N - 1)])
        expected.append(e - e_max_n)
    got = AL.oracle_advantages(support, N)
    np.testing.assert_allclose(got, expected, atol=1e-12)
    assert got.mean() == pytest.approx(0.0, abs=1e-12)  # E_r[E max(r, M_{N-1})] = E[M_N]
    # At values outside the support too (the same distribution): r = 2 with N = 2 → E[max(2, R)] − E[max(R, R')].
    if N == 2:
        assert AL.oracle_advantages(np.array([2.0]), 2, support)[0] == pytest.approx(
            np.mean([max(2.0, s) for s in support]) - e_max_n)


def test_oracle_advantages_by_hand_n2():
    # support {0, 1}: E[M_2] = 3/4; A*(0) = E[max(0, R)] − 3/4 = 1/2 − 3/4, A*(1) = 1 − 3/4.
    np.testing.assert_allclose(AL.oracle_advantages(np.array([0.0, 1.0]), 2), [-0.25, 0.25])


def test_oracle_rule_with_itself_is_one_and_cosine_from_gram():
    rng = np.random.default_rng(0)
    K, D = 12, 40
    G = rng.normal(size=(K, D))
    S = G @ G.T
    a, b = rng.normal(size=K), rng.normal(size=K)
    direct = (G.T @ a) @ (G.T @ b) / np.linalg.norm(G.T @ a) / np.linalg.norm(G.T @ b)
    assert AL.cosine(S, a, b) == pytest.approx(direct, rel=1e-12)
    assert AL.cosine(S, np.zeros(K), b) is None
    rewards = [rng.normal(size=K) for _ in range(3)]
    grams = [S, S, S]
    table = AL.alignment_table(grams, rewards, ["oracle", "grpo", "tea"], [K, 8], N=16, seeds=2)
    # The plug-in oracle on all K rollouts is the oracle itself: cosine exactly 1 at m = K.
    assert table["oracle"][str(K)]["mean"] == pytest.approx(1.0, abs=1e-12)
    assert table["oracle"][str(K)]["count"] == 6 and table["oracle"][str(K)]["sem"] == pytest.approx(0.0, abs=1e-12)
    for rule in ("grpo", "tea"):
        for m in (K, 8):
            c = table[rule][str(m)]
            assert -1.0 <= c["mean"] <= 1.0 and c["count"] == 6


def test_rules_that_cannot_use_an_m_are_skipped_and_marked():
    rng = np.random.default_rng(1)
    K = 16
    G = rng.normal(size=(K, 10))
    table = AL.alignment_table([G @ G.T], [rng.normal(size=K)], ["prefix_tea", "bon_mean", "tea"], [4, 16], N=8, seeds=1)
    assert table["prefix_tea"]["4"]["mean"] is None and "smallest valid" in table["prefix_tea"]["4"]["skipped"]
    assert table["tea"]["4"]["mean"] is None and "q=ceil(alpha*m)=1" in table["tea"]["4"]["skipped"]
    assert table["bon_mean"]["4"]["mean"] is not None  # k = 2 < m = 4
    assert AL.public(table)["tea"]["4"] == {"mean": None, "sem": None, "skipped": table["tea"]["4"]["skipped"]}


def test_paper_parameters_per_m():
    assert AL.rule_params("bon_mean", 24, 128) == {"k": 12}
    assert AL.rule_params("chow", 25, 128) == {"n_sel": 12, "m_corr": 13}
    assert AL.rule_params("cat_bon", 16, 128) == {"n_target": 128}
    assert AL.rule_params("tea", 16, 64) == {"n_target": 64}
    assert AL.rule_params("grpo", 16, 128) == {}


def test_gram_in_row_blocks_equals_one_pass():
    import torch

    rng = np.random.default_rng(2)
    G = torch.from_numpy(rng.normal(size=(7, 30)).astype(np.float32))
    calls = []

    def grads(rows):
        calls.append(list(rows))
        return G[rows]

    whole = AL.gram_matrix(grads, 7, 7)
    blocked = AL.gram_matrix(grads, 7, 3)
    np.testing.assert_allclose(blocked, whole, rtol=1e-6)
    np.testing.assert_allclose(whole, (G.double() @ G.double().T).numpy(), rtol=1e-6)
    assert calls[1:] == [[0, 1, 2], [3, 4, 5], [6], [3, 4, 5], [6], [6]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from tiny_lm import make_assets

    root = make_assets(tmp_path_factory.mktemp("alignment"))
    recipe = tiny_recipe(root / "policy", root / "data", name="tiny_align", rollout__max_new_tokens=6)
    write_recipe(root / "recipe.yaml", recipe)
    return root


def run_cli(root: Path, out: Path, *extra: str):
    cmd = [sys.executable, "-m", "teacli.cli", "diagnose", "alignment", str(root / "recipe.yaml"), "--prompts", "3",
           "--pool", "16", "--grad-prompts", "2", "--m", "8", "16", "--n", "8", "--seeds", "2",
           "--rules", "oracle", "grpo", "tea", "bon_mean", "prefix_tea", "--out", str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=tea_env(root), timeout=600)


def test_cli_end_to_end_on_the_tiny_model(tiny, tmp_path):
    out = tmp_path / "al"
    proc = run_cli(tiny, out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "alignment.json").read_text())
    assert set(data) == {"oracle", "grpo", "tea", "bon_mean", "prefix_tea"}
    assert data["oracle"]["16"]["mean"] == pytest.approx(1.0, abs=1e-9)  # m = K: the oracle itself
    for rule in ("grpo", "tea", "bon_mean"):
        for m in ("8", "16"):
            assert -1.0 <= data[rule][m]["mean"] <= 1.0 and data[rule][m]["sem"] >= 0.0
    assert data["prefix_tea"]["8"]["mean"] is None and "skipped" in data["prefix_tea"]["8"]
    meta = json.loads((out / "alignment.run.json").read_text())
    assert meta["block"] == "model.layers.1" and meta["block_parameters"] > 0
    pool = [json.loads(line) for line in (out / "pool.jsonl").read_text().splitlines()]
    assert len(pool) == 3 and all(len(p["completions"]) == 16 for p in pool)
    assert len(list((out / "gram").glob("*.npy"))) == 2
    S = np.load(out / "gram" / "00000.npy")
    assert S.shape == (16, 16) and np.allclose(S, S.T) and np.linalg.eigvalsh(S).min() > -1e-6 * np.abs(S).max()
    assert "| Oracle (plug-in) |" in (out / "alignment.md").read_text()
    assert (out / "alignment.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "pool" in proc.stderr and "gradients" in proc.stderr
    # Resumed: the pool and the Gram matrices are reused (no sampling, no gradients), same numbers; also from a pool
    # recorded when reward.kernels defaulted to eager, or before the hf-only keys existed: a python reward reads neither
    recorded = json.loads((out / "pool.run.json").read_text())
    assert recorded["reward"]["kind"] == "python" and recorded["reward"]["kernels"] == "auto"
    recorded["reward"]["kernels"] = "eager"
    del recorded["reward"]["share_prompts"]
    (out / "pool.run.json").write_text(json.dumps(recorded))
    again = run_cli(tiny, out)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((out / "alignment.json").read_text()) == data
    assert "pool:" not in again.stderr and "gradients:" not in again.stderr
    # Other pool settings against the stored pool are refused.
    other = run_cli(tiny, out, "--set", "rollout.temperature=0.5")
    assert other.returncode == 2 and "pool.run.json" in other.stderr and "sampling" in other.stderr


@pytest.mark.parametrize("extra, message", [
    (["--rules", "nope"], "unknown advantage rule 'nope'"),
    (["--m", "32"], "--m 32: each m must lie in 2"),
    (["--block", "7"], "--block 7: the model has 2 blocks"),
])
def test_cli_bad_input(tiny, tmp_path, extra, message):
    cmd = [sys.executable, "-m", "teacli.cli", "diagnose", "alignment", str(tiny / "recipe.yaml"), "--prompts", "1",
           "--pool", "4", "--grad-prompts", "1", "--m", "4", "--n", "4", "--seeds", "1", "--out", str(tmp_path / "o"), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=tea_env(tiny), timeout=600)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 or "error:" in proc.stderr.strip().splitlines()[-1]


def test_grad_prompts_defaults_to_at_most_prompts():
    """`--prompts 8` alone was refused ("--grad-prompts 32: larger than --prompts 8") (issue 22, item 16)."""
    from teacli.config import Recipe

    small = AL.Settings(recipe=Recipe(), out=Path("unused"), prompts=8)
    small.check()
    assert small.grad_prompts == 8
    assert AL.Settings(recipe=Recipe(), out=Path("unused")).grad_prompts == AL.DEFAULT_GRAD_PROMPTS == 32
    assert AL.Settings(recipe=Recipe(), out=Path("unused"), prompts=8, grad_prompts=4).grad_prompts == 4
    with pytest.raises(AL.AlignmentError, match="--grad-prompts 9: larger than --prompts 8"):
        AL.Settings(recipe=Recipe(), out=Path("unused"), prompts=8, grad_prompts=9).check()


# ------------------------------------------------------------------------------------------------
# Per-completion gradients: one batched backward (from each Linear's and RMSNorm's input and output
# gradient) against one backward per completion, on tiny models of three architectures built in-process


def _tiny_models():
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaForCausalLM, LlamaConfig, Qwen3Config, Qwen3ForCausalLM

    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                  vocab_size=50, max_position_embeddings=64, pad_token_id=0)
    out = {}
    torch.manual_seed(0)
    out["llama"] = LlamaForCausalLM(LlamaConfig(**common)).float().eval()
    torch.manual_seed(0)
    out["qwen3"] = Qwen3ForCausalLM(Qwen3Config(**common, head_dim=8)).float().eval()  # q_norm / k_norm on the head dim
    torch.manual_seed(0)
    out["gemma3"] = Gemma3ForCausalLM(Gemma3TextConfig(**common, head_dim=8)).float().eval()  # RMSNorm scale 1 + w
    for model in out.values():
        with torch.no_grad():  # non-zero norm scales and biases, so every kind of parameter has a distinct gradient
            for n, p in model.named_parameters():
                if "norm" in n or n.endswith("bias"):
                    p.add_(0.3 * torch.randn_like(p))
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_batched_completion_gradients_equal_one_backward_per_completion(arch):
    import torch

    model = _tiny_models()[arch]
    prefix, chosen = AL.block_parameters(model, "-1")
    params = [p for _, p in chosen]
    kinds = {k for _, k, _ in AL._per_sample_plan(model, params)}
    assert kinds == {"linear_weight", "rms_scale"}
    rng = np.random.default_rng(1)
    comps = [list(rng.integers(1, 50, size=int(k))) for k in (5, 1, 9, 3, 7, 2, 9)]  # ragged: padded rows
    args = (model, params, [3, 4, 5, 6], comps, 0, 3, torch.device("cpu"))
    loop = AL.completion_gradients(*args, method="loop")
    batched = AL.completion_gradients(*args, method="batched")
    assert loop.shape == (7, sum(p.numel() for p in params))
    rel = ((batched - loop).norm(dim=1) / loop.norm(dim=1)).max().item()
    assert rel < 1e-5, rel
    assert AL.completion_gradients(*args).equal(batched)  # auto picks the batched path here


def test_completion_gradients_fall_back_to_the_loop_where_the_batched_path_cannot_be_exact(monkeypatch):
    import torch

    model = _tiny_models()["llama"]
    rng = np.random.default_rng(2)
    comps = [list(rng.integers(1, 50, size=int(k))) for k in (4, 6, 2)]
    # The embedding is no Linear or RMSNorm: no plan, "auto" loops, "batched" is refused.
    emb = [model.model.embed_tokens.weight]
    for p in model.parameters():
        p.requires_grad_(False)
    emb[0].requires_grad_(True)
    assert AL._per_sample_plan(model, emb) is None
    args = (model, emb, [3, 4], comps, 0, 2, torch.device("cpu"))
    assert AL.completion_gradients(*args).equal(AL.completion_gradients(*args, method="loop"))
    with pytest.raises(AL.AlignmentError, match="Linear's or an RMSNorm's"):
        AL.completion_gradients(*args, method="batched")
    # An RMSNorm whose output is not its normalized input times its scale (here: a shift added) fails the
    # check: "auto" says so and loops, with the loop's gradients.
    emb[0].requires_grad_(False)
    _, chosen = AL.find_block(model, "-1")
    params = [p for _, p in chosen]
    for p in params:
        p.requires_grad_(True)
    norm = model.model.layers[-1].post_attention_layernorm
    plain = type(norm).forward
    monkeypatch.setattr(type(norm), "forward", lambda self, x: plain(self, x) + 0.5)
    said = []
    args = (model, params, [3, 4], comps, 0, 2, torch.device("cpu"))
    auto = AL.completion_gradients(*args, log=said.append)
    assert auto.equal(AL.completion_gradients(*args, method="loop"))
    assert len(said) == 1 and "failed their check" in said[0]


def test_alignment_plot_keeps_its_legend_off_the_curves_and_rules_that_coincide_apart(tmp_path, monkeypatch):
    """Nine rules' legend sat inside the axes over the curves, and rules with equal cosines (GRPO, GRPO-Z)
    were drawn exactly on top of each other."""
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox

    same = {"16": {"mean": 0.1, "sem": 0.01}, "32": {"mean": 0.2, "sem": 0.01}}
    table = {"grpo": same, "grpo_z": same, "tea": {"16": {"mean": 0.3, "sem": 0.02}, "32": {"mean": 0.4, "sem": 0.02}}}
    figs = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figs.append(self))
    AL.plot(table, {"m": [16, 32], "N": 128}, tmp_path / "a.png")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = figs[0]
    canvas = FigureCanvasAgg(fig)  # plot closed the figure (its pyplot canvas is gone)
    canvas.draw()
    r = canvas.get_renderer()
    (ax,) = fig.axes
    assert fig.legends and not Bbox.intersection(ax.get_window_extent(r), fig.legends[0].get_window_extent(r))
    xs = [tuple(c.lines[0].get_xdata()) for c in ax.containers]  # each rule's errorbar: its data line
    assert len(xs) == 3 and len(set(xs)) == 3  # each rule at its own x offset
