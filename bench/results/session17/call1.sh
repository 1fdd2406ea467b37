# session 17, call 1 (one H200): trace the first long prompt's one-off (~1 s, session 16) — per-step times, Triton
# compiles, profiler tables for a 65536-token prompt and the same length again; the slice's kernel profile at HEAD.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
mkdir -p $OUT/trace
timeout 240 python bench/long_prefill.py --ctx 65536 65536 --tokens 8 --trace $OUT/trace 2>&1 | grep -v -i warn | tail -n 4
GLMSERVE_PDL=0 timeout 200 python bench/profile_slice.py --rows 1 8 > $OUT/profile.txt 2>&1; tail -n 3 $OUT/profile.txt
cd $OUT && tar czf trace.tgz trace && rm -rf trace
