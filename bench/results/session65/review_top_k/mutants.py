"""Mutation check of ``glmkernels/triton_sample.py``'s ``_race`` (session 65's top-k review).

Each mutant is one or two textual edits of the kernel file (each original text must occur exactly as many
times as stated); the file is mutated in place in the repository this script is run from, the two test files
are run on it in the interpreter, and the file is restored with ``git checkout`` (also on an interrupt). Run
from a scratch clone's root, never from the main checkout:

    cd /tmp/clone && python bench/results/session65/review_top_k/mutants.py [NAME ...] > mutants.log

Prints one line per mutant: its name, killed or SURVIVED, and the failing tests (``<crash>``: pytest died).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

FILE = "glmkernels/triton_sample.py"
TESTS = ["tests/unit/test_review65_top_k.py", "tests/unit/test_top_k_race.py"]

# name: (original, replacement, occurrences), or a list of them
MUTANTS = {
    "rank_off_by_one": ("rank = before + tl.cumsum(tie.to(tl.int32), 0) - 1",
                        "rank = before + tl.cumsum(tie.to(tl.int32), 0)", 1),
    "crossing_gt": ("incl.to(tl.float64) >= target", "incl.to(tl.float64) > target", 1),
    "drop_topk_tie_mass": ("tl.store(s + 1, kept * wq)", "tl.store(s + 1, kept * 0)", 1),     # (s + 1 was 0)
    "per_row_k_ignored": ("p = tl.load(p_ptr + row) if PER_ROW else p_val",
                          "p = tl.load(p_ptr) if PER_ROW else p_val", 1),
    "boundary_slot_7": ("    else:\n        b, n = tl.load(s + 6), tl.load(s + 8)",
                        "    else:\n        b, n = tl.load(s + 6), tl.load(s + 7)", 1),
    "no_minimum": ("tl.minimum(n, nk)", "n", 1),
    "cap_is_nk": ("tl.minimum(n, nk)", "nk", 1),
    "none_p_uses_n": ("tl.where(b < 0, nk, tl.where", "tl.where(b < 0, n, tl.where", 1),
    "scan_one_copy": ("for c in range(1, copies):", "for c in range(1, 1):", 2),
    "copy_no_modulo": ("copy = tl.program_id(1) % copies", "copy = tl.program_id(1)", 1),
    "topk_mass_ge": ("key > tl.load(s + 6)", "key >= tl.load(s + 6)", 1),
    "topk_kept_minus_1": ("kept = (target - above.to(tl.float64)).to(tl.int64)",
                          "kept = (target - above.to(tl.float64)).to(tl.int64) - 1", 1),
    "topp_ties_floor": ("tl.math.ceil((target", "tl.math.floor((target", 1),
    "key_minus_zero": ("    b = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True).to(tl.int64)",
                       "    b = x.to(tl.int32, bitcast=True).to(tl.int64)", 1),
    "no_half_unit_floor": ("tl.maximum(p.to(tl.float64) * tl.load(s + 1).to(tl.float64), 0.5)",
                           "p.to(tl.float64) * tl.load(s + 1).to(tl.float64)", 1),
    "race_higher_id": [("| (4294967295 - col.to(tl.int64))", "| col.to(tl.int64)", 1),   # (and decoded)
                       ("return 4294967295 - (state[:, 5] & 4294967295)",
                        "return state[:, 5] & 4294967295", 1)],
    "before_le": ("mask=c < chunk, other=0", "mask=c <= chunk, other=0", 1),
    "above_zero_deeper": ("above = tl.load(s + SLOT + 1) if LEVEL > 0 else prefix * 0",
                          "above = prefix * 0", 1),
    "min_p_gt": ("kept = kept & (w >= (tl.load", "kept = kept & (w > (tl.load", 1),
    "max_pad_zero": (("x = tl.load(x_ptr + row * V + col, mask=col < V, other=-float(\"inf\"))\n"
                      "    tl.atomic_max(state_ptr + row * 16"),
                     ("x = tl.load(x_ptr + row * V + col, mask=col < V, other=0.0)\n"
                      "    tl.atomic_max(state_ptr + row * 16"), 1),
    "level_prefix_shift": ("live = (add > 0) & ((key >> (SHIFT + BITS)) == tl.load(s + SLOT))",
                           "live = (add > 0) & ((key >> (SHIFT + 12)) == tl.load(s + SLOT))", 1),
    # expected equivalent (README): -inf tokens not counted toward k; the fixed point truncated, not rounded
    "count_finite_only": ("add = (col < V).to(tl.int64)", "add = (x > -float(\"inf\")).to(tl.int64)", 1),
    "fixed_truncate": ("* 1099511627776.0 + 0.5).to(tl.int64)", "* 1099511627776.0).to(tl.int64)", 1),
}


def run(name: str, edits) -> str:
    with open(FILE) as f:
        src = f.read()
    for original, replacement, times in edits if isinstance(edits, list) else [edits]:
        assert src.count(original) == times, (name, src.count(original))
        src = src.replace(original, replacement)
    with open(FILE, "w") as f:
        f.write(src)
    try:
        env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
        t = time.time()
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *TESTS],
                             check=False, capture_output=True, text=True, env=env)
        failed = sorted(set(re.findall(r"^FAILED \S+?::(\S+)", out.stdout, re.MULTILINE)))
        if out.returncode not in (0, 1) and not failed:
            failed = ["<crash>"]
        verdict = "killed" if failed or out.returncode != 0 else "SURVIVED"
        return f"{name:22s} {verdict:8s} {time.time() - t:5.0f}s  {' '.join(failed)}"
    finally:
        subprocess.run(["git", "checkout", "--", FILE], check=True)


if __name__ == "__main__":
    clean = subprocess.run(["git", "diff", "--quiet", "--", FILE], check=False).returncode == 0
    assert clean, f"{FILE} is modified: not a clean clone"
    for name in sys.argv[1:] or MUTANTS:
        print(run(name, MUTANTS[name]), flush=True)
