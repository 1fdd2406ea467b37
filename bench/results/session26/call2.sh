# Session 26, call 2: the mid-size kernel's tests after the grid order change, then its launch sweep at 128 / 256 rows.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 120 python -m pytest -q --maxfail=6 --tb=short tests/gpu/test_kernels_gpu.py -k "gluon_mid or widening" 2>&1 | tail -5
timeout -s KILL 440 python bench/mid_gemm.py --out $OUT/mid --sweep hopper --rows 128 256 --budget-s 400 2>&1 | grep -v "^|"
