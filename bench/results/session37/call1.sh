# Session 37, call 1: the greedy MTP draft's lm_head split by vocabulary over a group (StepComm.argmax_logits):
# its micro-bench at GLM-5.2 widths, its captured-graph test over the ipc device phases, and the GPU tests whose
# captured drafting now takes it (2 ipc ranks) or its one-process form.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 120 python bench/vocab_head.py --out $OUT/vocab 2>&1 | tail -n 20
timeout -s KILL 150 python -m pytest -q tests/gpu/test_comm_gpu.py -k vocab > $OUT/test_comm_vocab.log 2>&1
tail -n 3 $OUT/test_comm_vocab.log
timeout -s KILL 200 python -m pytest -q -s tests/gpu/test_distributed_gpu.py -k "speculative_group" > $OUT/test_dist_spec.log 2>&1
tail -n 3 $OUT/test_dist_spec.log
timeout -s KILL 150 python -m pytest -q tests/gpu/test_graphs_gpu.py -k "speculative or drawn" > $OUT/test_graphs_spec.log 2>&1
tail -n 3 $OUT/test_graphs_spec.log
