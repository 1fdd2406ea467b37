"""HF-written bf16 checkpoint (save_pretrained, 16 shards, e_score_correction_bias fp32, gate bf16) + MTP layer keys in an
extra shard registered in the index → glmserve load_model, logits vs HF eager fp32 on the same directory.
Exit 0 when glmserve loads it and max|Δlogit| <= 1e-4 and the MTP tensors are loaded as written."""
import json, torch
from _common import *


def main():
    d = fresh("r1_hf_bf16")
    m = hf_build(TINY)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if not n.endswith("e_score_correction_bias"):
                p.data = p.data.to(torch.bfloat16)
    m.save_pretrained(d, max_shard_size="300KB")
    mtp = {k: (v if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)) for k, v in mtp_tensors(TINY).items()}
    add_shard(d, mtp, "model-mtp.safetensors")
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    print("shards:", len(set(idx["weight_map"].values())), "tensors:", len(idx["weight_map"]))
    dt = {}
    for k, v in read_all(d).items():
        dt.setdefault(str(v.dtype), 0); dt[str(v.dtype)] += 1
    print("dtypes in files:", dt)
    x = ids(48, TINY["vocab_size"])
    ours = ours_model(d)
    a = ours_logits(d, x, ours)
    b = hf_logits(d, x)
    diff = (a - b).abs().max().item()
    print(f"max |dlogit| ours vs HF (fp32 compute, bf16 files): {diff:.3e}")
    p = dict(ours.named_parameters())
    L = TINY["num_hidden_layers"]
    bad = []
    for k, v in mtp.items():
        import re
        mm = re.match(rf"model\.layers\.{L}\.mlp\.experts\.(\d+)\.(\w+)\.weight", k)
        got = p[f"model.layers.{L}.mlp.experts.{mm[2]}.weight"][int(mm[1])] if mm else p[k]
        if not torch.equal(got.float(), v.float()):
            bad.append(k)
    print("MTP tensors not loaded as written:", bad[:5], len(bad))
    print("e_score_correction_bias dtype in model:", p["model.layers.2.mlp.gate.e_score_correction_bias"].dtype,
          "gate.weight:", p["model.layers.2.mlp.gate.weight"].dtype)
    return 0 if diff <= 1e-4 and not bad else 1


run(main)
