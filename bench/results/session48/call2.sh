#!/bin/bash
# session 48, call 2: what a pass of prompt logprobs should hold (PROMPT_ROWS, 256 since session 47), the sweep on
# this card, then the worker-group tests whole (session 47's run was cut at 180 s).
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 160 python bench/prompt_scoring.py --slice --isl 4096 --prompts 8 --chunk 8192 --rounds 3 \
    --prompt-rows 256 1024 4096 --out $OUT/scoring 2>&1 | tail -10
timeout 150 python bench/sweep.py --slice --isl 1024 --osl 128 --concurrency 1 8 32 --requests-per-client 2 \
    --chunk 8192 --warmup-tokens 2048 --out $OUT 2>&1 | grep -v '^loading' | tail -8
timeout -s KILL 250 python -m pytest -q -rs tests/gpu/test_distributed_gpu.py > $OUT/distributed.log 2>&1
tail -12 $OUT/distributed.log
