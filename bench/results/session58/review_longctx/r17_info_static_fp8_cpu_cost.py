"""INFO, not a defect check (exits 0): CPU cost of the static-shape path (cuda_graphs: eager) with kv_cache_dtype fp8 at a
small prefill budget (33) near 2048 tokens, against the same with the model dtype and the eager path (cuda_graphs: off)."""
import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *
eng0, tok = engine()
P = {"b": (prompt_ids(2016, 2), 32), "e": (prompt_ids(1900, 9), 20)}
for graphs in ("off", "eager"):
    for dt in ("auto", "fp8"):
        eng, _ = engine(max_model_len=2048, kv_cache_tokens=2048, kv_cache_dtype=dt, max_num_batched_tokens=33, max_num_seqs=33, cuda_graphs=graphs)
        t = time.time()
        for r, (p, n) in P.items():
            run(eng, {r: (p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))})
        log(graphs, dt, f"{time.time()-t:.1f}s steps {eng.stats['steps']} graph {eng.stats['graph_steps']}")
finish(True, "informational")
