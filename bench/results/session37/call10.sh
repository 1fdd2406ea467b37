# Session 37, call 10: the split logits in up to 4 AG phases (a dp step of 8 rows a rank at N = 2 with a 16-row comm
# takes two), captured; and decode_slice's rank of dp 8 with the split past 2 rows a rank.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 100 python -m pytest -q -s tests/gpu/test_comm_gpu.py -k "vocab or bucket" > $OUT/test_comm_split.log 2>&1
grep -E "split ids|bit-equal|passed|failed|Left contains" $OUT/test_comm_split.log | tail -n 10
timeout -s KILL 200 python bench/decode_slice.py --out $OUT/dp --no-hf --modes auto_graph auto_graph_split --slices dp \
  > $OUT/dp.log 2>&1
grep -E "split by vocabulary" $OUT/dp/decode_slice.md | cut -c1-900
rm -f $OUT/dp/decode_slice.png
