#!/bin/bash
# session 47, call 1: the guided / thinking-budget / prompt-logprobs graph tests, then the headline decode_slice table with HF
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1; export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -s KILL 200 python -m pytest -q tests/gpu/test_graphs_gpu.py -k "thinking or structured_output or guided_request or prompt_logprobs" > $OUT/graphs_guided.log 2>&1; tail -3 $OUT/graphs_guided.log
( time timeout -s KILL 330 python bench/decode_slice.py --out $OUT/slice ) 2>&1 | tail -16 | cut -c1-180
