# Session 26, call 3: the mid-size kernel's tests (the pair-wise widening), then its launches at 32 / 64 / 100 / 200 rows.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 120 python -m pytest -q --maxfail=6 --tb=short tests/gpu/test_kernels_gpu.py -k "gluon_mid or widening" 2>&1 | tail -5
timeout -s KILL 450 python bench/mid_gemm.py --out $OUT/mid --sweep hopper --rows 100 200 32 64 --budget-s 420 2>&1 | grep -v "^|"
