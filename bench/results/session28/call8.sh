# Session 28, call 8: call 7's one-row GEMV default out again (slower in the kernel than in the bench's variant);
# the one-row MoE's wide-expert launches now reduce every K step (gate/up 16 × 512 with the shared expert fused,
# down 16 × 512): the MoE tests, then moe_one_row.py --each (its "shipped" line is the new pair).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 50 python -m pytest -q --tb=short tests/gpu/test_kernels_gpu.py -k "moe" 2>&1 | tail -20 \
    > $OUT/gpu_tests_moe.log
tail -2 $OUT/gpu_tests_moe.log
timeout -s KILL 45 python bench/moe_one_row.py --each 2>&1 | grep -v Warn | head -3 | tee $OUT/moe_each.txt
