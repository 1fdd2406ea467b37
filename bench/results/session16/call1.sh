# session 16, call 1 (one H200): graph widths — the paged indexer at padded widths, old kernels (HEAD 171d5ca's
# kernels/ in .old_rev) vs this session's (the -inf keys of the wide select counted in one add); the slice engine's
# step and warm-up at 4 / 2 / 1 widths an octave; session 15's comm-check fix on the GPU.
export NCCL_NVLS_ENABLE=0
mkdir -p $OUT/old $OUT/new
PYTHONPATH=.old_rev:. timeout 150 python bench/graph_width.py --indexer-only --out $OUT/old 2>&1 | grep -v -i warn | tail -n 12
PYTHONPATH=. timeout 330 python bench/graph_width.py --out $OUT/new 2>&1 | grep -v -i warn | tail -n 30
PYTHONPATH=. timeout 90 python -m pytest -q -rs tests/gpu -k "device_phase_wait" 2>&1 | tail -n 4
