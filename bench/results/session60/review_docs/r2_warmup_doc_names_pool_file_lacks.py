"""deploy/README.md:70 says "the 8×H200 file's 262144 tokens are 168 graph steps with MTP 3 (...)" and :74 "a 78-layer
replica's 140". deploy/glm5-8xh200.yaml no longer sets kv_cache_tokens (262144 is a commented-out line; the pool is
sized by gpu_memory_utilization and max_model_len defaults to the model's 202752 positions) nor speculative_tokens.
Prints the warm-up's graph-step count (scheduler.shapes.warm_keys, as Engine.warm_up calls it) for the file as shipped
and with MTP 3. Exit 1 while the doc names a 262144-token pool that the file does not set."""
import re
import sys
from pathlib import Path

import yaml

from cluster.config import EngineConfig
from scheduler.shapes import graph_widths, rank_seqs, warm_keys

root = Path(__file__).resolve().parents[4]
doc = (root / "deploy/README.md").read_text()
args = yaml.safe_load((root / "deploy/glm5-8xh200.yaml").read_text())["applications"][0]["args"]
cfg = EngineConfig.from_dict(args)
per_rank = max(rank_seqs(cfg.max_num_seqs, cfg.num_workers))
for ctx in (202752, 262144):
    widths = graph_widths(-(-ctx // cfg.block_size))
    shipped = len(warm_keys(cfg.num_workers, True, cfg.speculative_tokens, widths, per_rank))
    mtp3 = len(warm_keys(cfg.num_workers, True, 3, widths, per_rank))
    print(f"context {ctx}: {len(widths)} widths; file as shipped (speculative_tokens {cfg.speculative_tokens}): "
          f"{shipped} graph steps; with MTP 3: {mtp3}")
print("file sets kv_cache_tokens:", "kv_cache_tokens" in args, "| gpu_memory_utilization:", cfg.gpu_memory_utilization)
if re.search(r"8×H200 file's 262144 tokens", doc) and "kv_cache_tokens" not in args:
    print("WRONG: deploy/README.md names the 8×H200 file's 262144 tokens; the file sizes its pool to memory")
    sys.exit(1)
print("ok")
