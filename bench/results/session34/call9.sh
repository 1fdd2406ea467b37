# Session 34, call 9: the committed tree (glmkernels, the final MoE picks): the graph tests.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 170 python -m pytest -q tests/gpu/test_graphs_gpu.py > $OUT/test_graphs.log 2>&1
tail -1 $OUT/test_graphs.log
