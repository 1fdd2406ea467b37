# Session 28, call 5: test_gluon_mid_linear with the default launch on o_proj's and the dense gate's shapes (6144 ×
# 16384, 12288 × 6144: session 27's long-K mid_tile rule), 65..256 rows.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 150 python -m pytest -q --tb=short tests/gpu/test_kernels_gpu.py -k "gluon_mid_linear" 2>&1 | tail -20 \
    > $OUT/gpu_tests_mid.log
tail -2 $OUT/gpu_tests_mid.log
