#!/bin/bash
# session 48, call 7: vLLM's regex / choice grammars and allowed_token_ids on the GPU path, the structured-output GPU
# tests beside them, on the final tree.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -s KILL 200 python -m pytest -q tests/gpu/test_graphs_gpu.py -k "grammar or allowed or structured or guided" \
    > $OUT/graphs_guided.log 2>&1
tail -15 $OUT/graphs_guided.log
