# session 14, call 4: the group's comm check no longer waits for the step launched ahead (the error word read on a
# side stream) — a one-rank group's step with and without look-ahead again, then the device-phase comm tests
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
for a in "" "--no-lookahead"; do
  n=cs${a:+_noahead}
  timeout 150 python bench/cluster_slice.py --workers 1 --comms ipc --spec 0 --ctx 4096 --tokens 64 $a --out $OUT --name $n 2>&1 | grep -v Warn | grep '"depth"' | cut -c1-600
done
timeout 200 python -m pytest -q tests/gpu/test_comm_gpu.py -k "device or absent or timeout" 2>&1 | tail -3 | tee $OUT/gpu_comm_tests.txt
timeout 150 python -m pytest -q tests/gpu/test_distributed_gpu.py -k "ipc and auto" 2>&1 | tail -3 | tee $OUT/gpu_distributed_tests.txt
