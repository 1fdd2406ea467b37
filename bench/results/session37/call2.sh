# Session 37, call 2: vocab_head.py with the slice's product alone in two forms (F.linear, swapped W·xᵀ) and the
# bandwidth units fixed; the captured-graph test against the split computed on the rank alone.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 150 python bench/vocab_head.py --out $OUT/vocab 2>&1 | tail -n 16
timeout -s KILL 150 python -m pytest -q -s tests/gpu/test_comm_gpu.py -k vocab > $OUT/test_comm_vocab.log 2>&1
grep -E "split ids|passed|failed|Error" $OUT/test_comm_vocab.log | head
