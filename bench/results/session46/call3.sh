#!/bin/bash
# session 46, call 3 (H100): the three tests of tests/gpu/test_graphs_gpu.py that call 1's 170 s limit cut off
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1; export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 230 python -m pytest -q tests/gpu/test_graphs_gpu.py -k "structured_output or guided_request" 2>&1 | tail -8 \
    | tee $OUT/graphs_guided.txt
