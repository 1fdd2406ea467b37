# session 19, call 1 (one H200): graph steps to 64 rows a rank (256 in the MoE): the GPU tests of the kernels and
# graphs they touch, the absorb / expand past 16 rows, the fused vs grouped MoE at 128–256 rows, a batch of 32 / 64
# requests decoding with graphs capped at 16 rows (as before) and not.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
timeout 240 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_kernels_gpu.py -k "absorb or moe or route" \
  tests/gpu/test_graphs_gpu.py 2>&1 | tail -n 4
timeout 60 python bench/results/session19/absorb_rows.py 2>&1 | grep -v Warning
timeout 80 python bench/moe_prefill.py --fused --rows 128 192 256 2>&1 | grep "^I "
timeout 200 python bench/batch_decode.py --requests 32 64 --caps 16 --ctx 4096 2>&1 | grep "^{"
