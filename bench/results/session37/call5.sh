# Session 37, call 5: where a chained greedy MTP draft pass on a rank of 8 spends its time (its MTP layer's kernels).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 200 python bench/vocab_head.py --out $OUT/vocab --rows 1 --profile 2>&1 | grep -v "^|\|^- \|^$\|^Checks\|^check\|^Read" | tail -n 40
GLMSERVE_PDL=0 timeout -s KILL 200 python bench/vocab_head.py --out $OUT/vocab_nopdl --rows 1 --profile 2>&1 | grep -A27 "^-- the MTP"
