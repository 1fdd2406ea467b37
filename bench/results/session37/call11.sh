# Session 37, call 11: the sampler's tie order (stable sort; the top-k selection re-sorted by id, then stably by value)
# against HEAD's sampler (ab_old/), alternating twice: bench/sampler.py at 1 and 8 rows.
export PYTHONPATH=.
for i in 1 2; do
  echo "-- new $i"; timeout -s KILL 50 python bench/sampler.py --iters 30 2>&1 | grep -E "rows, "
  echo "-- old $i"; timeout -s KILL 50 env PYTHONPATH=ab_old:. python bench/sampler.py --iters 30 2>&1 | grep -E "rows, "
done
