"""The reward model's scoring on a GPU: no wait for the device between its batches."""

import pytest

pytestmark = pytest.mark.gpu


def test_reward_scoring_waits_for_the_gpu_once_whatever_its_batches(cuda, teacli_syncs):
    """HFRewardModel.score queues batch after batch: the synchronizing calls tea's own code makes
    (torch.cuda.set_sync_debug_mode's warnings, by the file that made them) are the same with 8 batches as with 2. A
    copy from pageable host memory, or reading the scores back, once a batch left the GPU idle between forwards."""
    import torch
    from tiny_lm import make_reward_model, make_tokenizer

    from teacli.rewards.hf import HFRewardModel
    from teacli.types import Prompt

    tok = make_tokenizer()
    rm = HFRewardModel(make_reward_model(tok).to(cuda, torch.bfloat16), tok)
    prompts = [Prompt(id=f"p{i}", messages=({"role": "user", "content": "the cat " * (1 + i % 5)},)) for i in range(16)]
    responses = ["a dog ran " * (1 + i % 7) for i in range(16)]

    def run(batch_size: int):
        def score():
            rm.batch_size = batch_size
            rm.score(prompts, responses)
        return score

    two, eight = teacli_syncs(run(8)), teacli_syncs(run(2))
    assert eight == two, f"tea's synchronizing calls with 2 batches {dict(two)}, with 8 {dict(eight)}"


@pytest.mark.parametrize("pack", [False, True])
def test_shared_prompt_scores_match_whole_conversations_in_bf16(cuda, pack):
    """reward.share_prompts on CUDA in bf16 (the prompts end to end in one row; with reward.pack_responses the
    responses too): each group's prompt run once gives the whole conversations' scores to bf16 rounding (CPU tests
    check float32 to 1e-5: tests/rewards/test_hf_shared.py)."""
    import torch
    from tiny_lm import make_reward_model, make_tokenizer

    from teacli.rewards.hf import HFRewardModel
    from teacli.types import Prompt

    tok = make_tokenizer()
    model = make_reward_model(tok).to(cuda, torch.bfloat16)
    prompts = [Prompt(id=f"p{i // 8}", messages=({"role": "user", "content": "the cat sat on the mat " * (3 + i // 8)},))
               for i in range(32)]
    responses = ["a dog ran " * (1 + i % 7) for i in range(32)]
    shared = HFRewardModel(model, tok, batch_size=8, share_prompts=True, pack_responses=pack)
    whole = HFRewardModel(model, tok, batch_size=8, share_prompts=False)
    assert shared.share_prompts and shared.pack_responses == pack
    a, b = shared.score(prompts, responses), whole.score(prompts, responses)
    assert shared.tokens_run < whole.tokens_run
    torch.testing.assert_close(a, b, rtol=0.02, atol=0.02)
