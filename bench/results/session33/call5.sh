# Session 33, call 5: this tree's decode_slice, every slice, graph path only (the machine still warm after call 4).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 200 python bench/decode_slice.py --out $OUT/slice --no-hf --modes auto_graph 2>&1 | grep '^|'
