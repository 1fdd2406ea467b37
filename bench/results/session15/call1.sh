# session 15, call 1 (nvidia-h200-x2): a worker group's decode step with look-ahead, one GPU per rank — the
# session-14 fix (comm check on a side stream) measured where ranks do not time-slice one GPU
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/machine.txt
for run in "2" "2 --no-lookahead" "1" ; do
  set -- $run; n=cs_w$1${2:+_noahead}
  timeout 140 python bench/cluster_slice.py --workers $1 --comms ipc --spec 0 --ctx 4096 --tokens 64 $2 --out $OUT --name $n 2>&1 | grep -v Warn | tail -n 2 | cut -c1-300
done
timeout 140 python bench/cluster_slice.py --workers 2 --comms ipc --spec 3 --ctx 4096 --tokens 64 --out $OUT --name cs_w2_spec3 2>&1 | grep -v Warn | tail -n 2 | cut -c1-300
