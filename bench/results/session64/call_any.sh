#!/bin/bash
# Session 64, device calls on whichever card comes (no kind named). `a`: the sampler's top-k keys in one Triton launch
# (their GPU tests, bench/results/session64/topk_keys.py), then the slice — with HF on an H200 (the headline table on
# this tree; session 48's is the last), without on an H100 (HF's bf16 slice does not fit beside ours). `b`: the graph
# tests (the sampler's keys inside the captured steps).
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$1" = a ]; then
    ( time timeout 150 python -m pytest -q -rs tests/gpu/test_kernels_gpu.py -k "value_id_keys or router_topk" ) \
        > $OUT/keys_tests.log 2>&1; echo "keys tests: $(grep -E 'passed|failed|error' $OUT/keys_tests.log | tail -1)"
    ( time timeout -s KILL 90 python bench/results/session64/topk_keys.py ) > $OUT/topk_keys.txt 2>&1
    cat $OUT/topk_keys.txt
    if [ "${mem:-0}" -gt 100000 ]; then hf=""; else hf="--no-hf"; fi
    ( time timeout -s KILL 300 python bench/decode_slice.py $hf --out $OUT/slice ) > $OUT/slice.txt 2>&1
    tail -22 $OUT/slice.txt | cut -c1-260
else
    ( time timeout 500 python -m pytest -q -rs -x tests/gpu/test_graphs_gpu.py ) > $OUT/test_graphs_gpu.log 2>&1
    echo "test_graphs_gpu: $(grep -E 'passed|failed|error' $OUT/test_graphs_gpu.log | tail -1)"
fi
