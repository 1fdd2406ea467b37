# session 16, call 5 (one H200): the prefill indexer's rows kernel — its tiles against the one-row kernel at a
# slab's rows, then the slice's long prefill before (8c8a2e7 in .old_rev: the one-row kernel) and after; GPU tests.
export NCCL_NVLS_ENABLE=0
PYTHONPATH=. timeout 120 python bench/index_prefill.py --rows 1024 --keys 8192 32768 131072 2>&1 | grep -v -i warn | tail -n 5
(cd .old_rev && PYTHONPATH=. timeout 200 python bench/long_prefill.py --ctx 65536 131072 262144 --out $OUT/old.jsonl 2>&1 | grep -v -i warn | tail -n 3)
PYTHONPATH=. timeout 200 python bench/long_prefill.py --ctx 65536 131072 262144 --out $OUT/new.jsonl 2>&1 | grep -v -i warn | tail -n 3
PYTHONPATH=. timeout 60 python -m pytest -q tests/gpu -k "indexer" 2>&1 | tail -n 2
