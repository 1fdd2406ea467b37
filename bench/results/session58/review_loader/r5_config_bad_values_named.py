"""Config edge cases: each must give a correct model or a ConfigError naming the field. Config-only (no weights).
Exit 1 while any case raises something other than ConfigError, or a ConfigError not naming the field, or is
silently accepted where it cannot be served."""
import json
from _common import *
from models.config import ConfigError, ModelConfig

# (name, change, field that the error must name; None = must be accepted)
NULLS = ["n_group", "topk_group", "first_k_dense_replace", "n_shared_experts", "routed_scaling_factor",
         "rms_norm_eps", "max_position_embeddings", "num_nextn_predict_layers"]
CASES = [(f"{k}=null", {k: None}, k) for k in NULLS] + [
    ("rope_scaling yarn (DeepSeek-V3.2 form)", {"rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                              "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}}, "rope_scaling"),
    ("rope_parameters yarn", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4}}, "rope_type"),
    ("rope_parameters 'type' key (legacy) = linear", {"rope_parameters": {"type": "linear", "rope_theta": 1e6, "factor": 4}}, "rope_parameters"),
    ("rope_scaling null", {"rope_scaling": None}, None),
    ("scoring_func softmax", {"scoring_func": "softmax"}, "scoring_func"),
    ("topk_method greedy", {"topk_method": "greedy"}, "topk_method"),
    ("num_nextn_predict_layers 2", {"num_nextn_predict_layers": 2}, "num_nextn_predict_layers"),
    ("num_nextn_predict_layers 0", {"num_nextn_predict_layers": 0}, None),
    ("unknown field", {"some_new_field": 1}, "some_new_field"),
    ("n_group 3 (not dividing 16)", {"n_group": 3, "topk_group": 1}, "n_group"),
    ("topk_group > n_group", {"topk_group": 5}, "topk_group"),
    ("quant_method modelopt (NVFP4)", {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}, "quant_method"),
    ("weight_block_size 64", {"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}}, "weight_block_size"),
    ("activation_scheme static", {"quantization_config": {"quant_method": "fp8", "activation_scheme": "static",
                                                           "weight_block_size": [128, 128]}}, None),   # input_scale tensors then fail as unexpected: acceptable
    ("num_experts conflicts n_routed_experts", {"num_experts": 32}, "num_experts"),
    ("moe_layer_freq 2", {"moe_layer_freq": 2}, None),   # HF ignores it too; dense/MoE tensors then mismatch: acceptable
    ("mlp_layer_types wrong length", {"mlp_layer_types": ["dense"] * 5}, "mlp_layer_types"),
    ("rope_interleave false (HF >=5.11 ignores it, always interleaved)", {"rope_interleave": False}, "rope_interleave"),
    ("indexer_types shared at 0", {"indexer_types": ["shared", "full", "full", "full", "full", "full"]}, "indexer_types"),
    ("head_dim 192 (GLM-5.2 bogus value)", {"head_dim": 192}, None),
    ("torch_dtype instead of dtype", {"torch_dtype": "bfloat16", "dtype": None}, None),
    ("dtype float8 (unsupported)", {"dtype": "float8_e4m3fn"}, None),
]


def main():
    bad = []
    for name, ch, field in CASES:
        d = dict(TINY)
        for k, v in ch.items():
            if v is None and k in ("dtype",):
                d.pop(k, None)
            else:
                d[k] = v
        try:
            c = ModelConfig.from_dict(d)
            out = f"accepted (n_routed_experts={c.n_routed_experts}, rope_interleave={c.rope_interleave})"
            ok = field is None
        except ConfigError as e:
            out = f"ConfigError: {e}"
            ok = field is not None and field in str(e)
        except Exception as e:
            out = f"{type(e).__name__} (not ConfigError): {e}"
            ok = False
        print(f"[{'ok ' if ok else 'BAD'}] {name}: {out}")
        if not ok:
            bad.append(name)
    print(f"{len(bad)} bad:", bad)
    return 1 if bad else 0


run(main)
