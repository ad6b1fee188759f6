set -x
cd TMP/proj
S=TMP/speed
NOVAL="--set validation.enabled=false"
REAL="--set rehearsal.lengths=realistic"
nvidia-smi --query-gpu=name,memory.total --format=csv
CARD=h100; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && CARD=h200
snap() { for r in runs/*; do mkdir -p $S/$(basename $r); cp $r/metrics.jsonl $r/recipe.yaml $S/$(basename $r)/ 2>/dev/null; done; rm -rf runs/*/checkpoints; }
python3 benchmarks/completion_splits.py --fresh --splits 1,4,packed --lengths realistic --sdpa no-cudnn --draws 4 --repeats 2 --json $S/splits.json > $S/splits.md 2> $S/splits.err
echo "splits done"
G=tests/gpu
timeout 300 python3 -m pytest -m gpu $G/test_gpu_reward.py $G/test_gpu_shared_checkpointing.py -q -p no:cacheprovider -rs --durations=30 > $S/gputests1.log 2>&1
echo "tests1 done"
python3 benchmarks/reward_scoring.py uf_llama1b_tea --card $CARD --kernels liger --share on,packed --lengths realistic --repeats 2 > $S/reward_real.md 2>&1
echo "probes done"
tea train uf_llama1b_tea --rehearse --steps 6 --run-dir runs/packed $NOVAL $REAL --set optim.completion_splits=packed --set reward.pack_responses=true > $S/packed.log 2>&1
python3 benchmarks/phases.py runs/packed --card $CARD --skip 3 > $S/phases_packed.md 2>&1; snap
echo "packed done"
tea train uf_llama1b_tea --rehearse --steps 6 --run-dir runs/real $NOVAL $REAL > $S/real.log 2>&1
python3 benchmarks/phases.py runs/real --card $CARD --skip 3 > $S/phases_real.md 2>&1; snap
echo "real done"
timeout 500 python3 -m pytest -m gpu $G/test_gpu_kernels.py $G/test_gpu_checkpointing.py $G/test_gpu_train.py $G/test_gpu_padding.py -q -p no:cacheprovider -rs --durations=30 > $S/gputests2.log 2>&1
echo "speed done"
