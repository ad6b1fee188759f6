set -x
NOVAL="--set validation.enabled=false"
BEFORE="--set policy.gradient_checkpointing=true --set optim.share_prompts=false --set reward.share_prompts=false --set reward.kernels=eager"
nvidia-smi --query-gpu=name,memory.total --format=csv
snap() { for r in runs/*; do mkdir -p OUT/$(basename $r); cp $r/metrics.jsonl $r/recipe.yaml OUT/$(basename $r)/ 2>/dev/null; done; }
tea train uf_llama1b_tea --rehearse --steps 3 --run-dir runs/reh_before $NOVAL $BEFORE > OUT/reh_before.log 2>&1
python3 benchmarks/phases.py runs/reh_before --card h200 --skip 1 > OUT/phases_before.md 2>&1; snap
tea train uf_llama1b_tea --rehearse --steps 3 --run-dir runs/reh_fixed $NOVAL > OUT/reh_fixed.log 2>&1
python3 benchmarks/phases.py runs/reh_fixed --card h200 --skip 1 > OUT/phases_fixed.md 2>&1; snap
tea train uf_llama1b_tea --rehearse --steps 3 --run-dir runs/reh_real $NOVAL --set rehearsal.lengths=realistic > OUT/reh_real.log 2>&1
python3 benchmarks/phases.py runs/reh_real --card h200 --skip 1 > OUT/phases_real.md 2>&1; snap
tea train uf_llama1b_tea --estimate --card h200 > OUT/estimate_fixed.txt 2>&1
tea train uf_llama1b_tea --estimate --card h200 --set rehearsal.lengths=realistic > OUT/estimate_real.txt 2>&1
tea train uf_llama1b_tea --estimate --card h200 $BEFORE > OUT/estimate_before.txt 2>&1
python3 benchmarks/offpolicy.py uf_llama1b_tea --out runs/offp --rehearse --steps 4 --skip 1 --set validation.enabled=false > OUT/offpolicy.md 2>&1; snap
for r in runs/offp/*; do mkdir -p OUT/offp_$(basename $r); cp $r/metrics.jsonl $r/recipe.yaml OUT/offp_$(basename $r)/ 2>/dev/null; done
python3 benchmarks/vs_trl.py --shape paper --steps 2 --json OUT/vs_trl_paper.json > OUT/vs_trl_paper.md 2>&1
timeout 300 python3 -m pytest -m gpu tests/gpu/test_gpu_shared_checkpointing.py tests/gpu/test_gpu_train.py tests/gpu/test_gpu_reward.py -q -p no:cacheprovider -k "shared_prompts_on_checkpointed or one_step_off or shared_prompt_scores or reads_nothing_back or waits_for_the_gpu" > OUT/gputests.log 2>&1
python3 benchmarks/vs_trl.py --steps 3 --json OUT/vs_trl_small.json > OUT/vs_trl_small.md 2>&1
echo "speed done"
