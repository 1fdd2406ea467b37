# session 18, call 2 (one H200): past 8 rows, the Gluon expert kernels with runs in chunks of 8 or 16 and 1 or 4
# down tiles a program (sweep), the MoE GPU tests; the Gluon rows linear at 16 rows (sweep, session 9's at 2–16).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
mkdir -p $OUT/moe $OUT/lin
timeout 150 python -m pytest -q -x tests/gpu/test_kernels_gpu.py -k "gluon_moe" 2>&1 | tail -n 15 | tee $OUT/tests.txt
timeout 250 python bench/rows_gemm.py --moe --moe-rows 16 32 64 --out $OUT/moe 2>&1 | grep -v Warning | tail -n 8
python - <<'PY'
import json, os
for r in json.load(open(os.environ["OUT"] + "/moe/rows_moe.json")):
    g = sorted(r["gluon"].items(), key=lambda kv: kv[1])
    print(r["I"], r["rows"], "tile", round(r["tile_us"], 1), "default", round(r["gluon"]["default"], 1),
          "| " + "; ".join(f"{k} {v:.1f}" for k, v in g[:8]))
PY
timeout 170 python bench/rows_gemm.py --rows 16 --out $OUT/lin 2>&1 | grep -v Warning | tail -n 12
