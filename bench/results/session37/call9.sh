# Session 37, call 9: decode_slice's rank of dp 8 with the lm_head split by vocabulary (auto_graph_split) beside the
# whole lm_head (auto_graph), in one run.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 240 python bench/decode_slice.py --out $OUT/dp --no-hf --modes auto_graph auto_graph_split --slices dp \
  > $OUT/dp.log 2>&1
tail -n 3 $OUT/dp.log | cut -c1-400
grep -E "^\| rank|split by vocabulary" $OUT/dp/decode_slice.md
rm -f $OUT/dp/decode_slice.png
