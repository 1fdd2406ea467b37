"""r7: a value that breaks a rule involving another field is reported as just "has an invalid value N", without the
rule: --max-num-batched-tokens 32 (must be >= max_num_seqs, 64 by default), --kv-cache-tokens 8 (must be >=
block_size 16), --host-kv-cache-tokens 64 with --no-prefix-caching (needs prefix caching), --speculative-tokens 9
(0..7), --num-workers in a yaml (1, 2, 4, 8). cluster/config.py:99-103 adds a hint for gpu_memory_utilization alone.

Fast (fails before any model loads). Exit 1 when one of these errors does not say what the field takes; 0 otherwise.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import cli  # noqa: E402

cases = [(["--max-num-batched-tokens", "32"], "max_num_seqs"),
         (["--kv-cache-tokens", "8"], "block_size"),
         (["--host-kv-cache-tokens", "64", "--no-prefix-caching"], "prefix"),
         (["--speculative-tokens", "9"], "7")]
bad = []
for args, must in cases:
    rc, out = cli("generate", *args, "x", timeout=60)
    last = out.strip().splitlines()[-1]
    print(f"generate {' '.join(args)} -> rc {rc}: {last}")
    if must not in last:
        bad.append(" ".join(args))
print("ok" if not bad else f"PRESENT: errors that do not name the rule: {bad}")
sys.exit(1 if bad else 0)
