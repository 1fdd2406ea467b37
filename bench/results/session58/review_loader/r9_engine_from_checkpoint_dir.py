"""End to end through cluster/local.build_local_engine: an EngineConfig pointing at the hand-built real-layout FP8
checkpoint of r2 (MTP layer, partial blocks, no tokenizer) serves token ids greedily, with and without MTP
speculation; both equal a greedy argmax loop over glmserve's own full-recompute logits. Also: max_model_len above
max_position_embeddings is refused naming it. Exit 0 when all hold (2 if r2's checkpoint is missing)."""
import torch
from _common import *
from cluster.config import EngineConfig
from cluster.local import build_local_engine
from scheduler.request import SamplingParams


def main():
    d = TMP / "r2_fp8"
    if not (d / "config.json").exists():
        print("run r2 first"); return 2
    prompt = ids(20, 1024, seed=7).tolist()
    model = ours_model(d)
    seq = list(prompt)
    for _ in range(12):
        seq.append(int(ours_logits(d, torch.tensor(seq), model)[-1].argmax()))
    want = seq[len(prompt):]
    got = {}
    for spec in (0, 2):
        eng, tok = build_local_engine(EngineConfig(model=str(d), device="cpu", kv_cache_tokens=512,
                                                   speculative_tokens=spec, max_num_batched_tokens=64), progress=False)
        rid = eng.add_request(prompt, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
        out = []
        while eng.has_unfinished():
            for ev in eng.step():
                assert ev.error is None, ev.error
                out += ev.token_ids
        got[spec] = out
        print(f"speculative_tokens={spec}: {out}  tokenizer={tok}")
    print("reference greedy:      ", want)
    ok = got[0] == want and got[2] == want
    try:
        build_local_engine(EngineConfig(model=str(d), device="cpu", kv_cache_tokens=8192, max_model_len=5000), progress=False)
        print("max_model_len 5000 > max_position_embeddings 4096: ACCEPTED"); ok = False
    except ValueError as e:
        print("max_model_len 5000:", e)
        ok = ok and "max_position_embeddings" in str(e)
    return 0 if ok else 1


run(main)
