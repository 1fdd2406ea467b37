# session 19, call 6 (one H200): the rank of dp 8 at 32 rows a rank profiled without PDL (call 5's kernel times
# overlap: a kernel under PDL launches early and its time holds its wait), and the tile kernel's launches at 32 / 64
# rows on the decode shapes (past Gluon's 8 rows every FP8 linear of a step takes it).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
GLMSERVE_PDL=0 timeout 120 python bench/profile_slice.py --shard --dp --rows 32 2>&1 | grep -v -i warn | head -n 24
timeout 330 python bench/rows_gemm.py --rows 32 64 --out $OUT 2>&1 | grep -E "^[a-z_ ]+ M=" 
