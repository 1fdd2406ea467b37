# session 17, call 7 (one H200): the same test on the previous revision — .old_rev = `git archive HEAD~1 cluster kernels
# models scheduler workers tests pyproject.toml` with the new tests/gpu/test_distributed_gpu.py copied in
export NCCL_NVLS_ENABLE=0
cd .old_rev && PYTHONPATH=. timeout 300 python -m pytest -q -x tests/gpu/test_distributed_gpu.py -k "eight_ranks" -p no:cacheprovider
# -> 1 failed: "worker group failed: step: rank 1 failed: RuntimeError: CUDA graph capture of the decode step (rows 8,
#    width 2 blocks) failed: Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor
#    is pinned. ..."
