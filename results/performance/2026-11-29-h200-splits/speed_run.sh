# on the GPU machine (after setup_project.sh has installed TMP/proj): issue 45's one-H200 measurements of this
# session, detached; the next calls: `sleep N; tail TMP/speed.log`. Writes TMP/speed/ (logs, tables, metrics).
cd TMP/proj || exit 1
export TEA_CACHE=TMP/teacache PIP_NO_INDEX=1 DS_ACCELERATOR=cuda PYTHONUNBUFFERED=1
mkdir -p TMP/speed
cat > TMP/speed/run.sh <<'EOS'
set -x
NOVAL="--set validation.enabled=false"
REAL="--set rehearsal.lengths=realistic"
nvidia-smi --query-gpu=name,memory.total --format=csv
snap() { for r in runs/*; do mkdir -p TMP/speed/$(basename $r); cp $r/metrics.jsonl $r/recipe.yaml TMP/speed/$(basename $r)/ 2>/dev/null; done; rm -rf runs/*/checkpoints; }
python3 benchmarks/completion_splits.py --draws 2 --repeats 3 --json TMP/speed/completion_splits.json > TMP/speed/completion_splits.md 2> TMP/speed/completion_splits.err
tea train uf_llama1b_tea --rehearse --steps 7 --run-dir runs/real $NOVAL $REAL > TMP/speed/real.log 2>&1
python3 benchmarks/phases.py runs/real --card h200 --skip 3 > TMP/speed/phases_real.md 2>&1; snap
timeout 540 python3 -m pytest -m gpu tests/gpu --ignore=tests/gpu/test_gpu_vllm.py -q -p no:cacheprovider -rs > TMP/speed/gputests.log 2>&1


tea train uf_llama1b_tea --estimate --card h200 $REAL > TMP/speed/estimate_real.txt 2>&1
python3 benchmarks/vs_trl.py --steps 3 --json TMP/speed/vs_trl_small.json > TMP/speed/vs_trl_small.md 2>&1
echo "speed done"
EOS
setsid nohup bash TMP/speed/run.sh > TMP/speed.log 2>&1 < /dev/null &
sleep 15; tail -3 TMP/speed.log
