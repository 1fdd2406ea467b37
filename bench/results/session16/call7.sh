# session 16, call 7 (one H200): the slice's long prefill with the rows kernel's picked tile (8 rows, 64 keys a step,
# 1024 keys a program, 4 warps), 65536 twice (is the first long prompt's extra time a one-off?); the whole GPU tier.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 150 python bench/long_prefill.py --ctx 65536 65536 131072 262144 --out $OUT/new.jsonl 2>&1 | grep -v -i warn | tail -n 4
timeout 330 python -m pytest -q -rs tests/gpu 2>&1 | grep -v "Warn\|warn" > $OUT/gpu_tests.log
tail -n 3 $OUT/gpu_tests.log
