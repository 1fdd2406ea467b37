#!/bin/bash
# session 47, call 3 (calls 1-2 never ran: no machine started): the GPU tests of this session and session 46's
# thinking budget (graph steps), what scoring prompts costs on the slice, then bench/sweep.py on the slice.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1; export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -s KILL 230 python -m pytest -q tests/gpu/test_graphs_gpu.py \
    -k "thinking or prompt_logprobs or structured_output or guided_request" > $OUT/graphs_new.log 2>&1
tail -3 $OUT/graphs_new.log
export PYTHONPATH=.
timeout 100 python bench/prompt_scoring.py --slice --isl 4096 --prompts 8 --chunk 8192 --rounds 3 \
    --out $OUT/scoring 2>&1 | tail -8
timeout 200 python bench/sweep.py --slice --isl 1024 --osl 128 --concurrency 1 8 32 --requests-per-client 2 \
    --chunk 8192 --warmup-tokens 2048 --out $OUT 2>&1 | grep -v '^loading' | tail -12
