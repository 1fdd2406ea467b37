# Session 37, call 4: vocab_head.py with a chained greedy MTP draft pass on rank 0 of 8 (tp shard, 1 row): the MTP
# layer alone, + the whole lm_head's argmax, + the split (the wire apart).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 200 python bench/vocab_head.py --out $OUT/vocab 2>&1 | tail -n 18
