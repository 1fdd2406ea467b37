# Session 34, call 8: the tree with `kernels/` renamed `glmkernels/` (Hugging Face's `kernels`, a transformers >= 5.25
# dependency, has the old import name): the GPU kernel tests and a no-HF decode_slice of the full slice on it.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 220 python -m pytest -q tests/gpu/test_kernels_gpu.py > $OUT/test_kernels.log 2>&1
tail -1 $OUT/test_kernels.log
timeout -s KILL 90 python bench/decode_slice.py --out $OUT/slice --no-hf --modes auto_graph --slices full 2>&1 \
  | grep -E "^\| full"
