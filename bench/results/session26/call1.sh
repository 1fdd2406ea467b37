# Session 26, call 1: the Gluon TMA / wgmma mid-size kernel's GPU tests, then its launches beside the Triton default.
set -x
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm --format=csv
timeout -s KILL 240 python -m pytest -q --maxfail=6 --tb=short tests/gpu/test_kernels_gpu.py -k "gluon_mid or widening" 2>&1 | tail -40
timeout -s KILL 330 python bench/mid_gemm.py --out $OUT/mid --sweep hopper --rows 128 256 \
    --shapes o_proj q_b "dense down" "dense gate_up 1/8" --budget-s 260 2>&1 | grep -v "^|"
cat $OUT/mid/mid_gemm.md 2>/dev/null | head -5
