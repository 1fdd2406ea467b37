# Session 38, call 5: the distributed GPU tests on this tree (ipc ranks on one H200; the NCCL cases need a GPU a rank).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 400 python -m pytest -q -rs tests/gpu/test_distributed_gpu.py > $OUT/test_distributed.log 2>&1
tail -n 1 $OUT/test_distributed.log
