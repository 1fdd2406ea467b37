# session 13, call 13: look-ahead decided by the engine for all ranks — ipc groups with captured graphs, and one process
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 190 python -m pytest -q tests/gpu/test_distributed_gpu.py tests/gpu/test_graphs_gpu.py -k "(test_greedy_tokens_equal_single_process and ipc and auto) or engine_with_graphs" 2>&1 | tail -4 | tee $OUT/gpu_lookahead_tests.txt
