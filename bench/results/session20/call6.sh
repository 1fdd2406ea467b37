# session 20, call 6 (one H200): look-ahead at batch with ragged prompts (requests open blocks at different steps):
# with the schedulers' slack position (this session), without it (session 19's rule: no look-ahead at a step where
# a row opens a block), and off.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 220 python bench/batch_decode.py --lookahead-ab --ragged --requests 32 64 --tokens 32 2>&1 | grep "^{"
