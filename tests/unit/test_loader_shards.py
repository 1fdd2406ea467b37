"""A rank's load is the slice of the whole model it holds: tp splits the MLPs' intermediate dim, ep the experts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from models.checkpoint import write_checkpoint
from models.glm5 import MoeShard
from models.loader import load_model


@pytest.fixture(scope="module", params=[False, True], ids=["bf16", "fp8"])
def ckpt(request, tmp_path_factory, tiny_config):
    """The tiny config; for FP8, MLPs wide enough to split over 4 ranks in whole 128-column blocks."""
    fp8 = request.param
    cfg = dataclasses.replace(tiny_config, moe_intermediate_size=512, intermediate_size=512) if fp8 else tiny_config
    path = tmp_path_factory.mktemp("shards") / ("fp8" if fp8 else "bf16")
    return write_checkpoint(path, cfg, seed=3, dtype="bfloat16", fp8=fp8, num_shards=3)


def expected_part(name: str, full: torch.Tensor, shard: MoeShard, experts: int) -> torch.Tensor:
    """The slice of the whole model's parameter ``name`` that ``shard`` holds (written out independently of the
    loader: experts by rank, the MLPs' intermediate dim by rank)."""
    if ".mlp.experts." in name and shard.mode == "ep":
        n = experts // shard.world_size
        full = full[shard.rank * n:(shard.rank + 1) * n]
    if ".mlp." in name and any(p in name for p in ("gate_proj", "up_proj", "down_proj")) \
            and (shard.mode == "tp" or ".experts." not in name):
        dim = -1 if "down_proj" in name else -2
        n = full.shape[dim] // shard.world_size
        full = full.narrow(dim, shard.rank * n, n)
    return full


@pytest.mark.parametrize("mode,world", [("tp", 2), ("tp", 4), ("ep", 2), ("ep", 4)])
def test_rank_loads_its_slice(ckpt, mode, world):
    full = load_model(ckpt, dtype=torch.bfloat16, progress=False)
    whole, experts = dict(full.named_parameters()), full.config.n_routed_experts
    for rank in range(world):
        shard = MoeShard(rank, world, mode)
        model = load_model(ckpt, dtype=torch.bfloat16, shard=shard, progress=False)
        params = dict(model.named_parameters())
        assert params.keys() == whole.keys()
        for name, p in params.items():
            want = expected_part(name, whole[name], shard, experts)
            assert p.shape == want.shape and p.dtype == want.dtype, name
            assert torch.equal(p.view(torch.uint8), want.contiguous().view(torch.uint8)), name
