# session 19, call 8 (one H200): call 7's step A/B again (its re-capture into a cleared graph table failed in the
# allocator): a fresh DecodeGraphs per setting.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 200 python bench/results/session19/mid_tile.py --steps 2>&1 | grep -v -i warn | tail -n 4
