#!/bin/bash
# session 48, call 4: allowed_token_ids on the GPU path (graph steps, look-ahead, graph drafting) beside the thinking
# budget's and prompt logprobs' GPU tests.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -s KILL 200 python -m pytest -q tests/gpu/test_graphs_gpu.py -k "allowed or thinking or prompt_logprobs" \
    > $OUT/graphs_new.log 2>&1
tail -15 $OUT/graphs_new.log
