# session 18, call 5 (one H200): where an 8-rank dp step's time goes at 8 rows a rank (MoE over 64 rows, I 256),
# kernels alone (no PDL); then the whole GPU tier at HEAD.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
GLMSERVE_PDL=0 timeout 90 python bench/profile_slice.py --shard --dp --rows 8 2>&1 | grep -v Warning | tail -n 32 | tee $OUT/profile_dp8.txt
timeout 450 python -m pytest -q tests/gpu -p no:cacheprovider 2>&1 | tail -n 15 | tee $OUT/gpu_tests.txt
