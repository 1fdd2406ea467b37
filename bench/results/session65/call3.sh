#!/bin/bash
# Session 65, call 3 (any card; after call 2 on the same machine): the engine's decode step (bench/step_host.py, the
# slice at 4k) greedy, drawn with GLM's top-p and with a top-k and top-p; and MTP speculative decoding (3 drafts) drawn
# with GLM's top-p, the sampler's ops as Triton and as PyTorch (--reference-sampler: as before sessions 64-65).
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
for a in "" "--temperature 1.0 --top-p 0.95" "--temperature 0.6 --top-k 20 --top-p 0.95" \
         "--spec 3 --temperature 1.0 --top-p 0.95" "--spec 3 --temperature 1.0 --top-p 0.95 --reference-sampler"; do
    n=sh$(echo $a | tr -d ' .-'); timeout 110 python bench/step_host.py --ctx 4096 --tokens 64 $a --out $OUT/$n \
    > $OUT/$n.txt 2>&1; echo "$a: $(grep -E '^decode step' $OUT/$n.txt)"; done
