"""Loader memory: _empty_model (models/loader.py:168-179) builds the model on meta with fp32 parameters, then
model.to_empty(device) allocates EVERY non-FP8 parameter in fp32 on the device before casting them one by one to
the serving dtype: the load peak is ~2x the bf16 weights. (1) Count it on the meta device for real shapes
(GLM-5 bf16 per rank under ep 8, and the reference §6.2 BF16 single-H200 variant); (2) measure it for real on CPU
(peak RSS while loading a ~400 MB bf16 checkpoint with dtype=bfloat16).
Exit 1 while the bytes allocated at to_empty exceed 1.1x the final parameter bytes."""
import json, resource, subprocess, sys, torch
from torch import nn
from _common import *
from models.config import ModelConfig
from models.glm5 import MoeShard
from models import loader

GLM5 = {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "vocab_size": 154880, "hidden_size": 6144,
        "intermediate_size": 12288, "moe_intermediate_size": 2048, "num_hidden_layers": 78, "num_attention_heads": 64,
        "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1,
        "routed_scaling_factor": 2.5, "first_k_dense_replace": 3, "index_n_heads": 32, "index_head_dim": 128,
        "index_topk": 2048, "num_nextn_predict_layers": 1, "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
        "max_position_embeddings": 202752, "rms_norm_eps": 1e-05, "dtype": "bfloat16"}


def at_to_empty(cfg, shard, fp8):
    seen = {}
    orig = nn.Module.to_empty

    def spy(self, *a, **k):
        out = orig(self, *a, **k)
        if "bytes" not in seen:
            seen["bytes"] = sum(p.numel() * p.element_size() for p in self.parameters())
        return out
    nn.Module.to_empty = spy
    try:
        m = loader._empty_model(cfg, shard, fp8, torch.bfloat16, "meta")
    finally:
        nn.Module.to_empty = orig
    final = sum(p.numel() * p.element_size() for p in m.parameters())
    return seen["bytes"], final


CHILD = r'''
import sys, resource, torch
sys.path.insert(0, "/work/main")
from models.loader import load_model
def hwm():
    return int([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1])
base = hwm()
m = load_model(sys.argv[1], dtype=torch.bfloat16, progress=False)
final = sum(p.numel() * p.element_size() for p in m.parameters())
peak = hwm()
if torch.cuda.is_available() and len(sys.argv) > 2:
    torch.cuda.reset_peak_memory_stats()
    del m
    m = load_model(sys.argv[1], dtype=torch.bfloat16, progress=False, device="cuda")
    print("cuda peak", torch.cuda.max_memory_allocated(), "final", sum(p.numel() * p.element_size() for p in m.parameters()))
print(base * 1024, peak * 1024, final)
'''


def main():
    worst = 0
    for name, d, shard in (("GLM-5 bf16, one rank of ep 8", GLM5, MoeShard(0, 8, "ep")),
                           ("ref §6.2 BF16 variant (6 layers, MTP), one H200",
                            dict(GLM5, num_hidden_layers=6, indexer_types=["full"] * 3 + ["shared"] * 3), MoeShard())):
        cfg = ModelConfig.from_dict(d)
        alloc, final = at_to_empty(cfg, shard, set())
        worst = max(worst, alloc / final)
        print(f"{name}: allocated at to_empty {alloc / 1e9:.1f} GB (fp32), final {final / 1e9:.1f} GB (bf16)")
    # FP8 checkpoint: only the bf16 remainder is doubled
    cfg = ModelConfig.from_dict(GLM5)
    fp8 = {n for n in loader.checkpoint_shapes(cfg) if loader.quantizable(n)}
    alloc, final = at_to_empty(cfg, MoeShard(0, 8, "ep"), fp8)
    print(f"GLM-5-FP8, one rank of ep 8: allocated at to_empty {alloc / 1e9:.1f} GB, final {final / 1e9:.1f} GB "
          f"(+{(alloc - final) / 1e9:.1f} GB transient)")
    # real measurement on CPU
    from models.checkpoint import write_checkpoint
    small = dict(TINY, vocab_size=65536, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=256,
                 num_hidden_layers=4, mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
                 indexer_types=["full", "shared", "full", "shared"])
    p = TMP / "r7_bf16"
    if not (p / "config.json").exists():
        write_checkpoint(p, ModelConfig.from_dict(small), seed=0, dtype="bfloat16")
    out = subprocess.run([sys.executable, "-c", CHILD, str(p)], capture_output=True, text=True, check=True).stdout.split()
    base, peak, final = map(int, out)
    print(f"CPU measure: bf16 params {final / 1e6:.0f} MB; peak RSS grew by {(peak - base) / 1e6:.0f} MB during load_model")
    return 1 if worst > 1.1 else 0


run(main)
