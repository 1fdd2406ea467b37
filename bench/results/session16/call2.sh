# session 16, call 2 (one H200): graph widths again, the scoring launch now skipping blocks past a row's position
# (no loads, no dot); then the whole GPU tier.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 200 python bench/graph_width.py --out $OUT 2>&1 | grep -v -i warn | tail -n 22
timeout 380 python -m pytest -q -rs tests/gpu 2>&1 | grep -v "Warn\|warn" > $OUT/gpu_tests.log
tail -n 12 $OUT/gpu_tests.log
