# Session 29, call 1: the graph tests with session 28's final one-row MoE launches (not run then); why the GEMV's
# per-step reduce is slower inside the shipped kernel (gemv_variants.py --explain); the per-step option on the
# one-row MoE's other launches: a tp shard's narrow experts (I 256) and the 8-pair launch (no shared expert fused).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
timeout -s KILL 200 python -m pytest -q --tb=short tests/gpu/test_graphs_gpu.py 2>&1 | tail -20 > $OUT/gpu_tests_graphs.log
tail -2 $OUT/gpu_tests_graphs.log
timeout -s KILL 150 python bench/gemv_variants.py --explain --out $OUT \
    --shapes 6144x16384 12288x6144 6144x12288 16384x2048 2>&1 | grep -v Warn | tee $OUT/gemv_explain.txt
timeout -s KILL 90 python bench/moe_one_row.py --each --width 256 2>&1 | grep -v Warn | tee $OUT/moe_each_narrow.txt
timeout -s KILL 90 python bench/moe_one_row.py --each --no-shared 2>&1 | grep -v Warn | tee $OUT/moe_each_8pair.txt
