"""Broken checkpoints → load_model must raise a named error (CheckpointError/ConfigError/ValueError whose message names
the offending tensor or file), within 60 s, never a bare library error or a silently wrong model.
Base: an FP8 3-shard checkpoint from models.checkpoint.write_checkpoint (the tiny §6.1 config, MTP layer included).
Exit 1 while any case is not named."""
import json, shutil, signal, torch
from pathlib import Path
from _common import *
from models.checkpoint import write_checkpoint
from models.config import ModelConfig
from models.loader import load_model
from safetensors.torch import save_file


def base():
    src = TMP / "r6_base"
    if not (src / "config.json").exists():
        write_checkpoint(src, ModelConfig.from_dict(TINY), seed=0, fp8=True, num_shards=3)
    return src


def copy(name):
    d = TMP / f"r6_{name}"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(base(), d)
    return d


def index(d):
    return json.loads((d / "model.safetensors.index.json").read_text())


def put_index(d, idx):
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))


def rewrite_tensor(d, name, new):
    """Replace one tensor (or add it when absent from its shard: give it the first shard)."""
    idx = index(d)
    f = idx["weight_map"].get(name) or sorted(set(idx["weight_map"].values()))[0]
    t = {k: v for k, v in read_file(d / f).items()}
    if new is None:
        t.pop(name)
    else:
        t[name] = new
    save_file(t, d / f, metadata={"format": "pt"})
    if new is not None:
        idx["weight_map"][name] = f
    else:
        idx["weight_map"].pop(name, None)
    put_index(d, idx)


def read_file(f):
    from safetensors import safe_open
    with safe_open(f, "pt") as fh:
        return {k: fh.get_tensor(k) for k in fh.keys()}


W = "model.layers.3.self_attn.kv_b_proj.weight"
EXP = "model.layers.3.mlp.experts.5.up_proj.weight"


def c_truncated(d):
    f = d / index(d)["weight_map"][W]
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    return f.name


def c_truncated_header(d):
    f = d / index(d)["weight_map"][W]
    f.write_bytes(f.read_bytes()[:100])
    return f.name


def c_wrong_shape(d):
    rewrite_tensor(d, W, torch.zeros(8, 8, dtype=torch.float8_e4m3fn))
    return W


def c_index_lacks_entry(d):            # tensor in a shard, not listed in the index
    idx = index(d)
    idx["weight_map"].pop(W)
    put_index(d, idx)
    return W


def c_index_names_absent_tensor(d):    # index says shard 1 holds it, shard lacks it
    idx = index(d)
    f = idx["weight_map"][W]
    other = [x for x in set(idx["weight_map"].values()) if x != f][0]
    idx["weight_map"][W] = other
    put_index(d, idx)
    return W


def c_index_names_missing_file(d):
    idx = index(d)
    idx["weight_map"][W] = "model-00009-of-00009.safetensors"
    put_index(d, idx)
    return "model-00009-of-00009.safetensors"


def c_e5m2_weight(d):
    t = read_file(d / index(d)["weight_map"][W])[W]
    rewrite_tensor(d, W, t.float().to(torch.float8_e5m2))
    return W


def c_int8_weight(d):
    t = read_file(d / index(d)["weight_map"][W])[W]
    rewrite_tensor(d, W, t.float().to(torch.int8))
    return W


def c_bf16_scale(d):
    s = W + "_scale_inv"
    t = read_file(d / index(d)["weight_map"][s])[s]
    rewrite_tensor(d, s, t.to(torch.bfloat16))
    return s


def c_scale_missing(d):        # fp8 weight left without its scale
    rewrite_tensor(d, W + "_scale_inv", None)
    return W


def c_expert_scale_missing(d):
    rewrite_tensor(d, EXP + "_scale_inv", None)
    return EXP


def c_missing_expert(d):
    rewrite_tensor(d, EXP, None)
    rewrite_tensor(d, EXP + "_scale_inv", None)
    return EXP


def c_missing_mtp_key(d):
    k = "model.layers.6.eh_proj.weight"
    rewrite_tensor(d, k, None)
    return k


def c_deepseek_mtp_extra_keys(d):   # DeepSeek-V3-style MTP copies of embed/lm_head
    k = "model.layers.6.shared_head.head.weight"
    rewrite_tensor(d, k, torch.zeros(1024, 256, dtype=torch.bfloat16))
    return k


def c_hf_rotary_buffer(d):
    k = "model.rotary_emb.inv_freq"
    rewrite_tensor(d, k, torch.zeros(32))
    return k


def c_int_norm(d):
    k = "model.norm.weight"
    rewrite_tensor(d, k, torch.ones(256, dtype=torch.int32))
    return k


def c_expert_index_out_of_range(d):
    k = "model.layers.3.mlp.experts.16.up_proj.weight"
    rewrite_tensor(d, k, torch.zeros(128, 256, dtype=torch.bfloat16))
    return k


def c_index_no_weight_map(d):
    put_index(d, {"metadata": {}})
    return "weight_map"


def c_index_bad_json(d):
    (d / "model.safetensors.index.json").write_text("{not json")
    return "model.safetensors.index.json"


CASES = [c_truncated, c_truncated_header, c_wrong_shape, c_index_lacks_entry, c_index_names_absent_tensor,
         c_index_names_missing_file, c_e5m2_weight, c_int8_weight, c_bf16_scale, c_scale_missing,
         c_expert_scale_missing, c_missing_expert, c_missing_mtp_key, c_deepseek_mtp_extra_keys, c_hf_rotary_buffer,
         c_int_norm, c_expert_index_out_of_range, c_index_no_weight_map, c_index_bad_json]


class Hang(Exception):
    pass


def main():
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(Hang()))
    load_model(base(), dtype=torch.float32, progress=False)   # the base loads
    bad = []
    for case in CASES:
        d = copy(case.__name__)
        what = case(d)
        signal.alarm(60)
        try:
            load_model(d, dtype=torch.float32, progress=False)
            out, ok = "LOADED without error", False
        except Hang:
            out, ok = "HANG > 60 s", False
        except ValueError as e:     # CheckpointError and ConfigError are ValueErrors
            msg = str(e).replace("\n", " ")
            ok = what in msg or Path(what).name in msg
            out = f"{type(e).__name__}: {msg[:230]}"
        except Exception as e:
            out, ok = f"{type(e).__module__}.{type(e).__name__} (not a named loader error): {str(e)[:200]}", False
        finally:
            signal.alarm(0)
        print(f"[{'ok ' if ok else 'BAD'}] {case.__name__[2:]} (should name {what}): {out}")
        if not ok:
            bad.append(case.__name__[2:])
    print(f"{len(bad)} bad:", bad)
    return 1 if bad else 0


run(main)
