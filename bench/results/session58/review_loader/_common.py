"""Shared helpers for the loader review scripts (tiny synthetic checkpoints under /tmp/review_loader)."""
import json, os, shutil, sys, warnings
from pathlib import Path
import torch

ROOT = Path("/work/main")
sys.path.insert(0, str(ROOT))
TMP = Path("/tmp/review_loader")
TMP.mkdir(exist_ok=True)
TINY = json.loads((ROOT / "models/configs/glm5-tiny-random.json").read_text())
warnings.filterwarnings("ignore")


def fresh(name):
    d = TMP / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def hf_build(cfg_dict, seed=0):
    """A tiny HF GlmMoeDsaForCausalLM (fp32) with perturbed norms / biases like the reference §6.1 recipe."""
    import transformers
    transformers.logging.set_verbosity_error()
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM
    kw = {k: v for k, v in cfg_dict.items() if k not in ("architectures", "model_type")}
    cfg = GlmMoeDsaConfig(**kw)
    torch.manual_seed(seed)
    m = GlmMoeDsaForCausalLM(cfg).float()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n and n.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif n.endswith("bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    return m


def hf_logits(path, ids):
    import transformers
    transformers.logging.set_verbosity_error()
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager",
                                             experts_implementation="eager").eval()
    with torch.no_grad():
        return m(ids[None]).logits[0]


def ours_model(path, dtype=torch.float32):
    from models.loader import load_model
    return load_model(path, dtype=dtype, progress=False)


def ours_logits(path, ids, model=None):
    from models.cache import KVCache, contiguous_batch
    model = model or ours_model(path)
    cache = KVCache(model.config, ids.numel() + 8, torch.float32)
    with torch.no_grad():
        batch = contiguous_batch([(0, ids.numel())], ids.numel() + 8)
        h = model(ids, batch, cache, None)
        return model.logits(h)


def ids(n, vocab, seed=1):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def mtp_tensors(cfg_dict, seed=5):
    """Full-precision MTP layer tensors model.layers.{L}.* in checkpoint layout (names from our own model)."""
    from models.config import ModelConfig
    from models.loader import random_state_dict
    cfg = ModelConfig.from_dict(cfg_dict)
    L = cfg.num_hidden_layers
    return {k: v for k, v in random_state_dict(cfg, seed=seed).items() if k.startswith(f"model.layers.{L}.")}


def add_shard(path, tensors, fname):
    """Write tensors as one more shard and register them in model.safetensors.index.json."""
    from safetensors.torch import save_file
    path = Path(path)
    save_file({k: v.contiguous() for k, v in tensors.items()}, path / fname, metadata={"format": "pt"})
    idx_p = path / "model.safetensors.index.json"
    idx = json.loads(idx_p.read_text())
    idx["weight_map"].update({k: fname for k in tensors})
    idx_p.write_text(json.dumps(idx, indent=2))


def read_all(path):
    """name -> tensor of a (sharded) checkpoint dir."""
    from safetensors import safe_open
    out = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(f, "pt") as fh:
            for k in fh.keys():
                out[k] = fh.get_tensor(k)
    return out


def write_sharded(path, tensors, n_shards=3, config=None):
    from safetensors.torch import save_file
    path = Path(path)
    names = sorted(tensors)
    wm = {}
    for i in range(n_shards):
        fn = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        chunk = names[i::n_shards]
        save_file({k: tensors[k].contiguous() for k in chunk}, path / fn, metadata={"format": "pt"})
        wm.update({k: fn for k in chunk})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wm}))
    if config is not None:
        (path / "config.json").write_text(json.dumps(config, indent=2))


def fp8_quant(w):
    """Reference §4 quantisation: per 128x128 block s = max|W|/448, W8 = (W/s).clamp(+-448).to(e4m3)."""
    out_, in_ = w.shape
    R, C = -(-out_ // 128), -(-in_ // 128)
    s = torch.empty(R, C)
    q = torch.empty(out_, in_, dtype=torch.float8_e4m3fn)
    for r in range(R):
        for c in range(C):
            blk = w[r * 128:(r + 1) * 128, c * 128:(c + 1) * 128].float()
            sc = max(blk.abs().max().item() / 448, 1e-12)
            s[r, c] = sc
            q[r * 128:(r + 1) * 128, c * 128:(c + 1) * 128] = (blk / sc).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, s


def fp8_dequant(q, s):
    out_, in_ = q.shape
    big = s.repeat_interleave(128, 0)[:out_].repeat_interleave(128, 1)[:, :in_]
    return q.float() * big


def real_fp8_quantizable(name):
    """Reference §4: which tensors the real FP8 builds quantise."""
    if not name.endswith(".weight") or "norm" in name:
        return False
    for s in ("embed_tokens", "lm_head", ".mlp.gate.weight", "weights_proj", "eh_proj"):
        if s in name:
            return False
    return True


def run(main):
    try:
        rc = main()
    except SystemExit:
        raise
    except Exception:
        import traceback
        traceback.print_exc()
        rc = 2
    sys.exit(rc)
