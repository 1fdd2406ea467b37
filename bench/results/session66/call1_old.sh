#!/bin/bash
# Session 66, call 1b (the same H100, warm): session 65's tree (its engine, runner and sampler copied in from old65/,
# as HEAD 88628fb had them) on the drawn MTP runs of call 1: no kernel compiled after its warm-up there either.
cp -r old65/cluster old65/workers . && git diff --stat 2>/dev/null | tail -1
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
for i in 1 2; do a="--spec 3 --temperature 1.0 --top-p 0.95"; n=old$i
  timeout 110 python bench/step_host.py --ctx 4096 --tokens 64 $a --out $OUT/$n > $OUT/$n.txt 2>&1
  echo "old tree $a: $(grep -E '^decode step|^timed decode' $OUT/$n.txt | cut -c1-400)"; done
a="--spec 3 --temperature 0.7 --top-k 20 --top-p 0.95"; n=oldk
timeout 110 python bench/step_host.py --ctx 4096 --tokens 64 $a --out $OUT/$n > $OUT/$n.txt 2>&1
echo "old tree $a: $(grep -E '^decode step|^timed decode' $OUT/$n.txt | cut -c1-400)"
