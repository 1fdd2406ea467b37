# session 14, call 7: what drawing a token costs on the GPU (bench/sampler.py), before any change to the sampler
export PYTHONPATH=.
timeout 200 python bench/sampler.py --out $OUT 2>&1 | grep -v Warn | tee $OUT/sampler.txt
