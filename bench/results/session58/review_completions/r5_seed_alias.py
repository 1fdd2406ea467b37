"""Seeds are taken modulo 2**63 (workers/sampler.py: manual_seed((seed * 1_000_003 + index) & (2**63 - 1))) and
protocol.py takes any integer: so seed 2**64 (beyond int64, a 400 in vLLM, whose seed field is bounded to int64) is
accepted and draws exactly seed 0's tokens, and two int64 seeds 2**63 apart (-1 and 2**63 - 1; -2**63 and 0) draw
the same tokens. Exits 1 while such seeds give the same sample (or 2**64 is taken)."""
import sys, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _h import *  # noqa: F401,F403

eng = engine()
ing = ingress(eng)
B = {"prompt": "In the beginning God created", "max_tokens": 10, "temperature": 1.0, "return_token_ids": True}


def draw(seed):
    st, b = call(ing, "completions", {**B, "seed": seed})
    return st, (b["choices"][0]["token_ids"] if st == 200 else b)


s0 = draw(0)[1]
st, big = draw(2**64)
print("seed 0     ", s0)
print("seed 2**64 ", st, big)
check(st == 400 or big != s0, "seed 2**64 is refused (vLLM: int64 bound) or draws other tokens than seed 0")
a, b = draw(-1)[1], draw(2**63 - 1)[1]
print("seed -1      ", a)
print("seed 2**63-1 ", b)
check(a != b, "seeds -1 and 2**63 - 1 (both int64) draw different tokens")
a, b = draw(-2**63)[1], s0
print("seed -2**63  ", a)
check(a != b, "seeds -2**63 and 0 draw different tokens")
c1, c2 = draw(7)[1], draw(8)[1]
check(c1 != c2, "control: seeds 7 and 8 differ")
done()
