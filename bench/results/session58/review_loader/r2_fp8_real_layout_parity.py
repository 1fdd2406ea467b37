"""A hand-built FP8 checkpoint in the real GLM-5-FP8 layout, at widths with partial 128-blocks (like kv_a 576 rows):
e4m3 weights + fp32 weight_scale_inv [ceil(out/128), ceil(in/128)], bf16 norms / k_norm w+b / weights_proj / router,
fp32 e_score_correction_bias, MTP layer (fp8 linears, bf16 enorm/hnorm/eh_proj/shared_head.norm), a real-style
quantization_config (modules_to_not_convert with the tensor-less `indexers_proj` names), 4 shards + index.
Oracle: HF eager fp32 on a second checkpoint whose weights are the §4 dequantisation (float(W8) * S) of the first.
Exit 0 when glmserve's logits on the FP8 dir match HF's on the dequantised dir (<=1e-4) and FP8 stays FP8 in memory."""
import json, torch
from _common import *

CFG = dict(TINY, hidden_size=192, intermediate_size=384, moe_intermediate_size=128, q_lora_rank=160, kv_lora_rank=112,
           qk_nope_head_dim=48, qk_rope_head_dim=32, qk_head_dim=80, v_head_dim=48, head_dim=32)


def main():
    m = hf_build(CFG)
    sd = {k: v.detach().float() for k, v in m.state_dict().items()}
    # HF state_dict has fused experts; take checkpoint layout from an HF save instead
    tmp = fresh("r2_hfsave")
    m.save_pretrained(tmp)
    sd = read_all(tmp)
    sd.update(mtp_tensors(CFG))
    fp8, deq = {}, {}
    for k, v in sd.items():
        if real_fp8_quantizable(k):
            q, s = fp8_quant(v.float())
            fp8[k], fp8[k + "_scale_inv"] = q, s
            deq[k] = fp8_dequant(q, s)
        else:
            keep32 = k.endswith("e_score_correction_bias")
            fp8[k] = v.float() if keep32 else v.to(torch.bfloat16)
            deq[k] = fp8[k].float()
    L = CFG["num_hidden_layers"]
    bf16_mods = sorted({k[:-len(".weight")] for k in fp8 if k.endswith(".weight") and k + "_scale_inv" not in fp8})
    bf16_mods += [k[:-len(".bias")] + ".bias" for k in fp8 if k.endswith("k_norm.bias")]
    bf16_mods += [f"model.layers.{i}.self_attn.indexers_proj" for i in range(L + 1)
                  if i == L or CFG["indexer_types"][i] == "full"]
    cfg8 = dict(CFG, quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                          "weight_block_size": [128, 128], "modules_to_not_convert": bf16_mods})
    d8, dq = fresh("r2_fp8"), fresh("r2_deq")
    write_sharded(d8, fp8, 4, cfg8)
    # HF oracle dir: no MTP (HF ignores only layer 78), fp32 dequantised weights
    write_sharded(dq, {k: v for k, v in deq.items() if not k.startswith(f"model.layers.{L}.")}, 2,
                  dict(CFG, num_nextn_predict_layers=0))
    shapes = {k: list(v.shape) for k, v in fp8.items() if k.endswith("kv_a_proj_with_mqa.weight_scale_inv")}
    print("example partial-block scale:", list(shapes.items())[0], "weight", list(fp8["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"].shape))
    x = ids(48, CFG["vocab_size"])
    ours = ours_model(d8)
    p = dict(ours.named_parameters())
    n8 = sum(1 for v in p.values() if v.dtype == torch.float8_e4m3fn)
    print("fp8 params in memory:", n8, "; scale params:", sum(1 for k in p if k.endswith("_scale_inv")))
    a = ours_logits(d8, x, ours)
    b = hf_logits(dq, x)
    diff = (a - b).abs().max().item()
    print(f"max |dlogit| glmserve(FP8 dir) vs HF(dequantised dir): {diff:.3e}")
    # MTP weights dequantised equal
    k = f"model.layers.{L}.self_attn.kv_a_proj_with_mqa"
    mod = ours.get_submodule(k)
    mdiff = (mod.dense_weight(torch.float32) - deq[k + ".weight"]).abs().max().item()
    print(f"MTP kv_a dequant vs §4 formula: {mdiff:.3e}")
    return 0 if diff <= 1e-4 and n8 > 0 and mdiff == 0 else 1


run(main)
