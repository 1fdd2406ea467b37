#!/bin/bash
# Session 32, call 5: the final tree — linear_group's apart path on the configured linear (W8A8 under the override),
# the grouped-linear kernel tests again, the engine gates of tests/gpu/test_distributed_gpu.py (kernels: auto).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 90 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "linear_group or w8a8_linear" 2>&1 \
    | tail -2 > $OUT/test_kernels.log
cat $OUT/test_kernels.log
timeout -s KILL 230 python -m pytest -q -x tests/gpu/test_distributed_gpu.py 2>&1 | tail -4 > $OUT/test_distributed.log
cat $OUT/test_distributed.log
