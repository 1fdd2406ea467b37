# session 19, call 9 (one H200): after the mid-size tile change, the GPU tests whose engines prefill 65–256-row chunks
# and compare token streams (graphs vs eager, groups vs one process).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 330 python -m pytest -q -p no:cacheprovider tests/gpu/test_graphs_gpu.py tests/gpu/test_distributed_gpu.py \
  -k "engine or greedy_tokens or speculative" 2>&1 | tail -n 3
