set -x
while pgrep -f "vs_trl.py --shape paper" > /dev/null; do sleep 2; done
pkill -f OUT/run.sh; sleep 1; pkill -f "pytest -m gpu"; pkill -f "vs_trl.py --steps 3"
rm -rf runs/reh_*/checkpoints runs/offp; df -h /tmp | tail -1
python3 benchmarks/offpolicy.py uf_llama1b_tea --out runs/offp --rehearse --steps 4 --skip 1 --set validation.enabled=false > OUT/offpolicy.md 2>&1
for r in runs/offp/*; do mkdir -p OUT/offp_$(basename $r); cp $r/metrics.jsonl $r/recipe.yaml OUT/offp_$(basename $r)/ 2>/dev/null; done
rm -rf runs/offp/*/checkpoints
python3 benchmarks/decode_step.py --repeats 2 > OUT/decode_step.md 2>&1
timeout 240 python3 -m pytest -m gpu tests/gpu/test_gpu_shared_checkpointing.py tests/gpu/test_gpu_train.py tests/gpu/test_gpu_reward.py -q -p no:cacheprovider -k "shared_prompts_on_checkpointed or one_step_off or shared_prompt_scores or reads_nothing_back or waits_for_the_gpu" > OUT/gputests.log 2>&1
python3 benchmarks/vs_trl.py --steps 3 --json OUT/vs_trl_small.json > OUT/vs_trl_small.md 2>&1
echo "chain2 done"
