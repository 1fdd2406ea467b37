# Session 27, call 1: the test added after session 26's last call (the mid-size kernel at 16 / 40 / 64 rows by
# default) and its neighbours; the shipped mid-size kernel timed alone at 128 / 256 rows; the one-row step of the
# slice in launch order (kernel-alone times, GLMSERVE_PDL=0) and its step time (decode_slice, graph path).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 150 python -m pytest -q --tb=short tests/gpu/test_kernels_gpu.py -k "gluon_mid or widening or fp8_linear" \
    2>&1 | tail -6 | tee $OUT/gpu_tests_mid.log
timeout -s KILL 80 python bench/mid_gemm.py --out $OUT/mid --sweep hopper --rows 128 256 --budget-s 60 2>&1 | grep -v "^|"
timeout -s KILL 90 env GLMSERVE_PDL=0 python bench/profile_slice.py --rows 1 --sequence > $OUT/profile_rows1.txt 2>&1
head -32 $OUT/profile_rows1.txt
timeout -s KILL 150 python bench/decode_slice.py --out $OUT/slice --no-hf --modes auto_graph --no-shard 2>&1 | tail -12
