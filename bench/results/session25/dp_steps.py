"""Session 25: the slice's 'rank of dp 8' decode step (graph replay; MoE and MLPs over every rank's rows: 128 and 256
at 16 and 32 rows a rank) with ``mid_tile`` as session 24 shipped it (``unswapped``) and as now (``swapped`` from 1024
outputs), alternating three times, a fresh graph table each (session 19's ``mid_tile.py --steps`` with these rules).

    PYTHONPATH=. python bench/results/session25/dp_steps.py
"""

from __future__ import annotations

import bench.results.session19.mid_tile as s19
from glmkernels import triton_linear as tl_mod

if __name__ == "__main__":
    s19.steps(rules={"unswapped": tl_mod.unswapped_mid_tile, "swapped": tl_mod.mid_tile})
