# Session 38, call 4: the GPU test files on this tree (kernels, graphs, comm), session 37's changes included.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 200 python -m pytest -q tests/gpu/test_kernels_gpu.py > $OUT/test_kernels.log 2>&1; tail -n 1 $OUT/test_kernels.log
timeout -s KILL 200 python -m pytest -q tests/gpu/test_graphs_gpu.py > $OUT/test_graphs.log 2>&1; tail -n 1 $OUT/test_graphs.log
timeout -s KILL 180 python -m pytest -q tests/gpu/test_comm_gpu.py > $OUT/test_comm.log 2>&1; tail -n 1 $OUT/test_comm.log
