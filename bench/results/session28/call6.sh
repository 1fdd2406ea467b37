# Session 28, call 6: the one-row GEMV written another way (bench/gemv_variants.py: a reduce every K step, a wider
# tile, a pipelined loop) beside the shipped kernel and a bare load stream, on o_proj, the dense gate, q_b, q_a.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 420 python bench/gemv_variants.py --out $OUT 2>&1 | grep -v Warn | tee $OUT/gemv_variants.txt
