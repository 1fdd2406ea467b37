# session 16, call 4 (one H200): a long prompt's prefill in 8192-token chunks on the slice — time to first token and
# the memory the prefill takes beyond weights and KV — before (HEAD 171d5ca in .old_rev: one [chunk, context] fp32
# score tensor per indexer call) and after (scores in slabs of at most INDEXER_SCORE_BYTES = 512 MiB).
export NCCL_NVLS_ENABLE=0
(cd .old_rev && PYTHONPATH=. timeout 250 python bench/long_prefill.py --ctx 65536 131072 --out $OUT/old.jsonl 2>&1 | grep -v -i warn | tail -n 4)
PYTHONPATH=. timeout 300 python bench/long_prefill.py --ctx 65536 131072 262144 --out $OUT/new.jsonl 2>&1 | grep -v -i warn | tail -n 5
PYTHONPATH=. timeout 40 python -m pytest -q tests/gpu -k "indexer" 2>&1 | tail -n 2
