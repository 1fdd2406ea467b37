"""EngineConfig: nonsensical combinations fail at start (EngineConfig or build_local_engine) with an error that names
the field."""
import json
import shutil
import tempfile
from pathlib import Path

from _h3 import check, done, engine, greedy, prompt, run
from cluster.config import DEFAULT_MODEL

cases = [
    ("block_size", dict(block_size=0)),
    ("block_size", dict(block_size=-16)),
    ("kv_cache_tokens", dict(kv_cache_tokens=8)),
    ("kv_cache_tokens", dict(kv_cache_tokens=0)),
    ("max_model_len", dict(kv_cache_tokens=256, max_model_len=512)),
    ("max_model_len", dict(max_model_len=0)),
    ("speculative_tokens", dict(speculative_tokens=8)),
    ("speculative_tokens", dict(speculative_tokens=-1)),
    ("host_kv_cache_tokens", dict(prefix_caching=False, host_kv_cache_tokens=256)),
    ("max_num_batched_tokens", dict(max_num_seqs=8, max_num_batched_tokens=4)),
    ("max_num_seqs", dict(max_num_seqs=0)),
    ("max_waiting_tokens", dict(kv_cache_tokens=512, max_model_len=256, max_waiting_tokens=100)),
    ("max_waiting_tokens", dict(kv_cache_tokens=512, max_waiting_tokens=100)),     # max_model_len from the pool
    ("num_workers", dict(num_workers=3)),
    ("max_model_len", dict(kv_cache_tokens=8192, max_model_len=4096)),   # the tiny model has 2048 positions
]
for field, kw in cases:
    try:
        eng, _ = engine(**kw)
        check(False, f"{kw}: started (max_model_len {eng.config.max_model_len}); expected an error naming '{field}'")
        if eng.config.max_model_len > 2048:     # what it admits: positions past the model's 2048
            try:
                eng.scheduler.check_admission("long", prompt(3000), greedy(1000))
                print(f"     ... and it admits a 3000-token prompt + max_tokens 1000 (positions to 3999 > 2048)")
            except Exception as e:  # noqa: BLE001
                print("     ... refused:", e)
    except Exception as e:  # noqa: BLE001
        check(field in str(e), f"{kw}: {type(e).__name__}: {str(e)[:150]}")

# speculative_tokens on a checkpoint without an MTP layer
tmp = Path(tempfile.mkdtemp())
cfg = json.loads((Path(DEFAULT_MODEL) / "config.json").read_text())
cfg["num_nextn_predict_layers"] = 0
(tmp / "config.json").write_text(json.dumps(cfg))
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(Path(DEFAULT_MODEL) / f, tmp / f)
try:
    engine(model=str(tmp), load_format="dummy", kv_cache_tokens=256, speculative_tokens=2)
    check(False, "speculative_tokens 2 on a checkpoint without an MTP layer: started")
except Exception as e:  # noqa: BLE001
    check("speculative_tokens" in str(e), f"speculative_tokens 2 without an MTP layer: {type(e).__name__}: {e}")
shutil.rmtree(tmp)

# block sizes that are not a power of two: accepted; do they serve (CPU, reference kernels)?
for bs in (12, 24):
    try:
        eng, _ = engine(kv_cache_tokens=bs * 16, block_size=bs, max_model_len=bs * 8, max_num_seqs=4,
                        max_num_batched_tokens=32)
        ref, _ = engine(kv_cache_tokens=512, max_model_len=bs * 8, max_num_seqs=4, max_num_batched_tokens=32)
        reqs = {f"b{i}": (prompt(40 + 7 * i, seed=i), greedy(12)) for i in range(4)}
        a = run(ref, reqs)[0]
        b = run(eng, reqs)[0]
        check(a == b, f"block_size {bs} (not a power of two) accepted and serves as block 16 (CPU)")
    except Exception as e:  # noqa: BLE001
        check(False, f"block_size {bs}: accepted by EngineConfig, then {type(e).__name__}: {e}")
done()
