set -x
cd TMP/proj
S=TMP/speed
nvidia-smi --query-gpu=name,memory.total --format=csv
python3 -c "import torch; from torch.nn.attention import SDPBackend; print('sdpa order', [SDPBackend(i).name for i in torch._C._get_sdp_priority_order()], torch.backends.cudnn.version())"
python3 benchmarks/completion_splits.py --fresh --splits 1 --lengths fixed,realistic --sdpa default,no-cudnn,cudnn,efficient --draws 4 --repeats 2 --profile --json $S/fresh.json > $S/fresh.md 2> $S/fresh.err
TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 python3 benchmarks/completion_splits.py --fresh --splits 1 --lengths fixed,realistic --sdpa cudnn,default --draws 4 --repeats 2 --json $S/fresh_avoid.json > $S/fresh_avoid.md 2> $S/fresh_avoid.err
echo "probes done"
G=tests/gpu
python3 -m pytest -m gpu $G/test_gpu_checkpointing.py $G/test_gpu_shared_checkpointing.py $G/test_gpu_train.py $G/test_gpu_kernels.py -q -p no:cacheprovider -rs --durations=30 > $S/gputests1.log 2>&1
echo "tests1 done"
python3 -m pytest -m gpu $G/test_gpu_reward.py $G/test_gpu_speed.py $G/test_gpu_padding.py $G/test_gpu_alignment.py $G/test_gpu_rehearsal.py -q -p no:cacheprovider -rs --durations=30 > $S/gputests2.log 2>&1
echo "speed done"
