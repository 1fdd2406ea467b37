"""NOTES.md's "Where the code differs from DESIGN.md" says the Gluon expert kernels serve "2–128" rows ("the experts for
2–128 since session 18"); glmkernels/gluon_rows.py:54 has MOE_MAX_ROWS = 256 (README.md:73 says 2–256). Exit 1 while the
section says 128 and the code says otherwise."""
import re
import sys
from pathlib import Path

from glmkernels.gluon_rows import MOE_MAX_ROWS

root = Path(__file__).resolve().parents[4]
notes = (root / "NOTES.md").read_text()
section = re.search(r"^## Where the code differs from DESIGN.md\n(.*?)(?=^## )", notes, re.S | re.M).group(1)
m = re.search(r"experts for 2[–-](\d+)", section)
print("NOTES:", m.group(0) if m else None, "| gluon_rows.MOE_MAX_ROWS =", MOE_MAX_ROWS)
if m and int(m.group(1)) != MOE_MAX_ROWS:
    print("WRONG: stale row bound in NOTES.md")
    sys.exit(1)
print("ok")
