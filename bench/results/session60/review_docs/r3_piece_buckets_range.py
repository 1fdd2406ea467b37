"""deploy/README.md:52 says each layer's per-row work is captured per rows bucket "(8 … `max_num_batched_tokens`)".
workers/pieces.py:46,74 caps the buckets at 2048 rows (larger steps stay eager), below the 8×H200 file's
max_num_batched_tokens (8192). Exit 1 while the doc says max_num_batched_tokens and the cap is lower."""
import sys
from pathlib import Path

import yaml

from workers.pieces import PIECE_BUCKETS

root = Path(__file__).resolve().parents[4]
doc = (root / "deploy/README.md").read_text()
args = yaml.safe_load((root / "deploy/glm5-8xh200.yaml").read_text())["applications"][0]["args"]
print("PIECE_BUCKETS:", PIECE_BUCKETS, "| file max_num_batched_tokens:", args["max_num_batched_tokens"])
if "(8 … `max_num_batched_tokens`)" in doc and PIECE_BUCKETS[-1] < args["max_num_batched_tokens"]:
    print(f"WRONG: pieces stop at {PIECE_BUCKETS[-1]} rows; steps of {PIECE_BUCKETS[-1] + 1}.."
          f"{args['max_num_batched_tokens']} rows run eagerly")
    sys.exit(1)
print("ok")
