#!/bin/bash
# session 46, call 3: the fixed-concurrency sweep (bench/sweep.py) on the GLM-5.2-width slice, one GPU
set -x
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.used --format=csv
python -c "import safetensors; print('safetensors', safetensors.__version__)"
timeout 420 python bench/sweep.py --slice --isl 1024 --osl 256 --concurrency 1 4 8 16 32 64 --requests-per-client 3 \
    --chunk 8192 --warmup-tokens 2048 --out $OUT 2>&1 | grep -v '^loading' | tail -20
