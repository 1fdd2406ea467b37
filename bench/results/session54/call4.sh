#!/bin/bash
# Session 54, device call 4: call 3's traces show the step stream idle ~2 ms (paced) / 3-5 ms (unpaced) between import
# steps while the host runs Python: `probe.py` times the engine's and runner's parts of each step (paced, 4 and 1 fill
# threads; unpaced).
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; date; } > $OUT/device.txt; cat $OUT/device.txt
for args in "" "--threads 1" "--unpaced"; do
  timeout 150 python bench/results/session54/probe.py $args 2>&1 | grep -A3 "^| 131072" | cut -c1-420 | tee -a $OUT/probe.txt
done
