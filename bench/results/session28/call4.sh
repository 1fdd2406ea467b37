# Session 28, call 4: call 3's mixed-step A/B ran out of memory (16 full-width MoE layers: 154 GB of experts); again
# at 8 layers — session 27's mid_tile rule (this tree) against 7593508's gluon_mid.py, twice alternating.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
rm -rf /tmp/mid && mkdir -p /tmp/mid && cp -r kernels /tmp/mid/ && git show 7593508:kernels/gluon_mid.py > /tmp/mid/kernels/gluon_mid.py
A="--depth 8 --modes pieces --prompts 100 200 --repeats 3 --ctx 2048"
for r in 1 2; do
  timeout -s KILL 100 python bench/mixed_steps.py $A > $OUT/mixed_new$r.txt 2>&1
  timeout -s KILL 100 env PYTHONPATH=/tmp/mid:. python bench/mixed_steps.py $A > $OUT/mixed_old$r.txt 2>&1
done
grep -h '"case"' $OUT/mixed_*.txt | cut -c1-300
tail -3 $OUT/mixed_new1.txt | cut -c1-300
