# Session 33, call 6: an ep rank's MoE (32 experts of 6144 × 2048 held, top-8 of 256 routed): moe_tile's pick (it
# counts runs as if every pair were local) against the launches that fit the real runs, at 8 / 64 / 128 rows.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 170 python bench/moe_few_rows.py --held 32 --rows 8 64 128 --draws 3 --out $OUT 2>&1 | tail -4
