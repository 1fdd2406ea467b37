# Session 37, call 6: a graph step's logits split by vocabulary (StepComm.bucket_logits: span verify, dp rows, drawn
# drafts) — its captured-graph GPU test, every comm / distributed / speculative-graph GPU test, and vocab_head.py with
# the logits table and the drawn draft's pass.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 120 python -m pytest -q -s tests/gpu/test_comm_gpu.py -k "vocab or bucket" > $OUT/test_comm_split.log 2>&1
grep -E "split ids|bit-equal|passed|failed" $OUT/test_comm_split.log | tail -n 8
timeout -s KILL 150 python bench/vocab_head.py --out $OUT/vocab 2>&1 | tail -n 30
timeout -s KILL 300 python -m pytest -q -s tests/gpu/test_distributed_gpu.py > $OUT/test_dist.log 2>&1
grep -E "captured drafting|passed|failed" $OUT/test_dist.log | tail -n 4
timeout -s KILL 100 python -m pytest -q tests/gpu/test_graphs_gpu.py -k "speculative or drawn" > $OUT/test_graphs_spec.log 2>&1
tail -n 2 $OUT/test_graphs_spec.log
