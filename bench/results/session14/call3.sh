# session 14, call 3: as call 2 with a group of one rank (two ranks on one GPU time-slice it: call 2 measured that, not the look-ahead),
# the slice at 1 dense + 1 / 3 MoE layers, one greedy request after 4096 tokens
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
for a in "" "--no-lookahead"; do
  n=cs${a:+_noahead}
  timeout 280 python bench/cluster_slice.py --workers 1 --comms ipc --spec 0 --ctx 4096 --tokens 64 $a --out $OUT --name $n 2>&1 | grep -v Warn | tail -4 | cut -c1-600
done
