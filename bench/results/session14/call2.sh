# session 14, call 2: a worker group's decode step with and without look-ahead — 2 ipc ranks (both on the one GPU),
# the slice at 1 dense + 1 / 3 MoE layers, one greedy request after 4096 tokens
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
for a in "" "--no-lookahead"; do
  n=cs${a:+_noahead}
  timeout 280 python bench/cluster_slice.py --workers 2 --comms ipc --spec 0 --ctx 4096 --tokens 64 $a --out $OUT --name $n 2>&1 | grep -v Warn | tail -4 | cut -c1-600
done
