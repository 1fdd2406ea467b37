"""Config variants an operator may meet, each written by HF save_pretrained (bf16, sharded, no MTP so
num_nextn_predict_layers 0) and compared glmserve vs HF eager fp32 on the same directory.
Exit 0 when every variant loads and matches within 1e-4."""
import json, torch
from _common import *

BASE = dict(TINY, num_nextn_predict_layers=0)
VARIANTS = {
    "norm_topk_prob_false": dict(norm_topk_prob=False),
    "no_groups_n1_t1": dict(n_group=1, topk_group=1),
    "routed_scaling_1.7": dict(routed_scaling_factor=1.7),
    "first_k_dense_0_no_mlp_types": dict(first_k_dense_replace=0, mlp_layer_types=None),
    "first_k_dense_3_no_mlp_types": dict(first_k_dense_replace=3, mlp_layer_types=None),
    "rms_eps_1e-6": dict(rms_norm_eps=1e-6),
    "indexer_types_from_freq4_offset3": dict(indexer_types=None, index_topk_freq=4, index_skip_topk_offset=3),
    "glm5_all_full_no_indexshare_keys": dict(indexer_types=None, index_topk_freq=None, index_skip_topk_offset=None,
                                             index_topk_pattern=None),
    "rope_theta_8e6": dict(rope_parameters={"rope_theta": 8000000, "rope_type": "default"}),
}


def main():
    fails = []
    for name, ch in VARIANTS.items():
        cfg = dict(BASE)
        for k, v in ch.items():
            if v is None:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        d = fresh(f"r3_{name}")
        m = hf_build(cfg)
        m.to(torch.bfloat16).save_pretrained(d, max_shard_size="500KB")
        c = json.loads((d / "config.json").read_text())
        x = ids(40, cfg["vocab_size"])
        try:
            a = ours_logits(d, x)
        except Exception as e:
            print(f"{name}: glmserve failed: {type(e).__name__}: {e}")
            fails.append(name)
            continue
        b = hf_logits(d, x)
        diff = (a - b).abs().max().item()
        print(f"{name}: indexer_types={c.get('indexer_types')} mlp={c.get('mlp_layer_types')} max|dlogit|={diff:.2e}")
        if diff > 1e-4:
            fails.append(name)
    print("failing:", fails)
    return 1 if fails else 0


run(main)
