#!/bin/bash
# Session 54, device call 3: where a paced import step's 2-3 ms go (call 2: the step that only sends rows is not held,
# the ones that also land the step before's are): the stall bench's last round (131k tokens) under torch.profiler,
# paced and unpaced, and the GPU timeline of each (`timeline.py`: copies to the device, the landings' index_copy
# kernels, gaps in the step stream).
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; date; } > $OUT/device.txt; cat $OUT/device.txt
for args in "" "--unpaced"; do
  d=$OUT/prof${args}
  timeout 150 python bench/disagg.py stall --device cuda --slice $args --profile --tokens 32768 131072 --out $d 2>&1 | grep "writing steps" | cut -c1-200
  python bench/results/session54/timeline.py $d/stall_trace.json > $d/timeline.txt 2>&1; head -50 $d/timeline.txt | cut -c1-110
  gzip $d/stall_trace.json; ls -la $d
done
