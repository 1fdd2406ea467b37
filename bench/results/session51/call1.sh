# Session 51, device call 1: session 50's GPU test case and the disagg tests, the import stall on the slice, graphs
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv; date; } > $OUT/device.txt
timeout 170 python -m pytest -q -rs tests/gpu/test_disagg_gpu.py > $OUT/test_disagg_gpu.log 2>&1; tail -3 $OUT/test_disagg_gpu.log
timeout 130 python bench/disagg.py stall --device cuda --slice --tokens 8192 32768 131072 --out $OUT 2>&1 | tail -5
timeout 130 python bench/disagg.py stall --device cuda --slice --fp8 --tokens 8192 32768 131072 --out $OUT 2>&1 | tail -5
timeout 120 python -m pytest -q -rs tests/gpu/test_graphs_gpu.py > $OUT/test_graphs_gpu.log 2>&1; tail -3 $OUT/test_graphs_gpu.log
