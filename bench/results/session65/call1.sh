#!/bin/bash
# Session 65, call 1 (needs_h200: HF's bf16 slice and its cache do not fit an H100 beside ours): the headline table on
# this tree with HF (session 48's is the last on an H200), the sampler's kernel tests, the drawn step beside greedy
# through the engine (bench/step_host.py), and the graph tests at session 64's final code (its last GPU run of them was
# before the no-rows fix).
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout -s KILL 300 python bench/decode_slice.py --out $OUT/slice ) > $OUT/slice.txt 2>&1
tail -22 $OUT/slice.txt | cut -c1-260
for a in "" "--temperature 1.0 --top-p 0.95"; do n=sh$(echo $a | tr -d ' .-'); timeout 100 python bench/step_host.py \
    --ctx 4096 --tokens 64 $a --out $OUT/$n > $OUT/$n.txt 2>&1; grep -E "^decode step" $OUT/$n.txt; done
( time timeout 250 python -m pytest -q -rs -x tests/gpu/test_graphs_gpu.py ) > $OUT/test_graphs_gpu.log 2>&1
echo "test_graphs_gpu: $(grep -E 'passed|failed|error' $OUT/test_graphs_gpu.log | tail -1)"
