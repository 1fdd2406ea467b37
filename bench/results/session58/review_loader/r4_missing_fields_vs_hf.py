"""Fields removed from an HF-written config.json (which transformers itself accepts, filling its class defaults):
does glmserve build the same model as HF from the same directory?  Exit 1 while any variant differs from HF
(logits > 1e-4, or max_position_embeddings differs: it becomes glmserve's default max_model_len)."""
import json, shutil, torch
from _common import *

BASE = dict(TINY, num_nextn_predict_layers=0, max_position_embeddings=202752)


def edit(d, drop=(), add=None):
    p = d / "config.json"
    c = json.loads(p.read_text())
    for k in drop:
        c.pop(k, None)
    c.update(add or {})
    p.write_text(json.dumps(c, indent=2))


VARIANTS = {
    "no_routed_scaling_factor": dict(drop=["routed_scaling_factor"]),
    "no_rms_norm_eps": dict(drop=["rms_norm_eps"]),
    "no_max_position_embeddings": dict(drop=["max_position_embeddings"]),
    "no_indexer_types_freq3_offset2": dict(drop=["indexer_types"]),
    "legacy_top_level_rope_theta": dict(drop=["rope_parameters"], add={"rope_theta": 1000000}),
    "no_rope_at_all": dict(drop=["rope_parameters"]),
}


def main():
    from transformers import AutoConfig
    from models.config import ModelConfig
    src = fresh("r4_src")
    m = hf_build(BASE)
    m.to(torch.bfloat16).save_pretrained(src, max_shard_size="500KB")
    x = ids(40, BASE["vocab_size"])
    fails = []
    for name, ch in VARIANTS.items():
        d = TMP / f"r4_{name}"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        edit(d, **ch)
        hc = AutoConfig.from_pretrained(d)
        try:
            oc = ModelConfig.from_json(d)
            a = ours_logits(d, x)
        except Exception as e:
            print(f"{name}: glmserve refused: {type(e).__name__}: {e}")
            continue          # a clear refusal is acceptable
        b = hf_logits(d, x)
        diff = (a - b).abs().max().item()
        vals = (f"routed_scaling HF {hc.routed_scaling_factor} / ours {oc.routed_scaling_factor}; eps HF {hc.rms_norm_eps} / "
                f"ours {oc.rms_norm_eps}; max_pos HF {hc.max_position_embeddings} / ours {oc.max_position_embeddings}; "
                f"theta HF {hc.rope_parameters.get('rope_theta')} / ours {oc.rope_theta}; "
                f"indexer_types HF {''.join(t[0] for t in hc.indexer_types)} / ours {''.join(t[0] for t in oc.indexer_types)}")
        bad = diff > 1e-4 or hc.max_position_embeddings != oc.max_position_embeddings
        print(f"{name}: max|dlogit|={diff:.2e} {'DIFFERS' if bad else 'ok'} | {vals}")
        if bad:
            fails.append(name)
    print("differing from HF:", fails)
    return 1 if fails else 0


run(main)
