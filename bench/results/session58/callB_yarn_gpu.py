"""Session 58, device call B: DeepSeek-V3.2's layout (half-split indexer RoPE, no IndexShare) and YaRN RoPE scaling on
the GPU path. The reference §6.1 tiny config with random weights (a checkpoint without a tokenizer: token ids), three
cases — glm_moe_dsa + YaRN, deepseek_v32, deepseek_v32 + YaRN (factor 4 over 16 positions, mscale 1) — each served by
an fp32 engine on the GPU with `kernels: auto` (Triton, CUDA graphs, MTP k = 2) and with `kernels: reference` (eager):
greedy tokens of 6 requests together (prompts 20–300 tokens, 24 tokens each) and one alone (32, drafting) compared. (Logits against transformers: on CPU,
tests/integration/test_parity_hf.py::test_deepseek_v32_matches_hf.)"""
import json
import sys
import tempfile

import torch

sys.path.insert(0, ".")
from cluster.config import EngineConfig  # noqa: E402
from cluster.local import build_local_engine  # noqa: E402
from models.checkpoint import write_checkpoint  # noqa: E402
from models.config import ModelConfig  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402
from tests.integration.test_engine import _outputs  # noqa: E402

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}


def config(model_type: str, yarn: bool) -> ModelConfig:
    d = json.load(open("models/configs/glm5-tiny-random.json"))
    if model_type == "deepseek_v32":
        d.update(model_type="deepseek_v32", architectures=["DeepseekV32ForCausalLM"])
        for k in ("indexer_types", "index_share_for_mtp_iteration", "indexer_rope_interleave"):
            d.pop(k, None)
    if yarn:
        d["rope_parameters"] = YARN
    return ModelConfig.from_dict(d)


def main() -> int:
    bad = 0
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 1000, (n,), generator=g).tolist() for n in (20, 37, 64, 129, 200, 300)]
    for model_type, yarn in (("glm_moe_dsa", True), ("deepseek_v32", False), ("deepseek_v32", True)):
        with tempfile.TemporaryDirectory() as d:
            write_checkpoint(d, config(model_type, yarn), seed=7, dtype="float32")
            outs = {}
            for kernels in ("auto", "reference"):
                engine, _ = build_local_engine(EngineConfig(
                    model=d, device=DEVICE, dtype="float32", kernels=kernels, kv_cache_tokens=8192, warmup_tokens=0,
                    speculative_tokens=2 if kernels == "auto" else 0,
                    cuda_graphs="auto" if kernels == "auto" else "off"), progress=False)
                reqs = {f"r{i}": (p, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
                        for i, p in enumerate(prompts)}
                outs[kernels] = {r: o[0] for r, o in _outputs(engine, reqs).items()}
                solo = {"solo": (prompts[4], SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True))}
                outs[kernels]["solo"] = _outputs(engine, solo)["solo"][0]      # alone: MTP drafts (k = 2) ride
                stats = {k: engine.stats[k] for k in ("graph_steps", "draft_rounds") if k in engine.stats}
                del engine
                torch.cuda.empty_cache() if DEVICE == "cuda" else None
                print(f"  {model_type} yarn={yarn} kernels={kernels}: {stats}")
            same = sum(outs["auto"][r] == outs["reference"][r] for r in outs["auto"])
            first = [next((i for i, (a, b) in enumerate(zip(outs["auto"][r], outs["reference"][r])) if a != b), None)
                     for r in outs["auto"]]
            print(f"{model_type} yarn={yarn}: {same}/7 requests' greedy tokens equal (auto+graphs+MTP vs "
                  f"reference eager); first differing token per request {first}")
            bad += same < 7
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
