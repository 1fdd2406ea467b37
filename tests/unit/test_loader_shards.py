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


@pytest.mark.parametrize("mode", ["tp", "ep"])
def test_a_rank_reads_only_what_it_keeps(ckpt, monkeypatch, mode):
    """Each rank read every expert whole from disk and dropped the rest (8× a real checkpoint's ~750 GB over an 8-rank
    group): an ep rank reads its own experts' tensors and no other's, a tp rank the rows or columns of the MLPs it keeps.
    (Checked by the elements read through safetensors' lazy slices.)"""
    import safetensors

    opened, read = safetensors.safe_open, {}

    class Counting:
        def __init__(self, *a, **k):
            self.fh = opened(*a, **k)

        def __enter__(self):
            self.fh.__enter__()
            return self

        def __exit__(self, *exc):
            return self.fh.__exit__(*exc)

        def keys(self):
            return self.fh.keys()

        def get_slice(self, name):
            sl = self.fh.get_slice(name)

            class Slice:
                get_shape, get_dtype = sl.get_shape, sl.get_dtype

                def __getitem__(self, index):
                    t = sl[index]
                    read[name] = read.get(name, 0) + t.numel()
                    return t
            return Slice()

    full = load_model(ckpt, dtype=torch.bfloat16, progress=False)
    monkeypatch.setattr(safetensors, "safe_open", Counting)
    world = 4
    load_model(ckpt, dtype=torch.bfloat16, shard=MoeShard(1, world, mode), progress=False)
    experts = full.config.n_routed_experts
    expert_reads = {n: k for n, k in read.items() if ".mlp.experts." in n and n.endswith(".weight")}
    whole = sum(p.numel() for n, p in full.named_parameters() if ".mlp.experts." in n and n.endswith("_proj.weight"))
    assert 0 < sum(expert_reads.values()) == whole // world
    if mode == "ep":
        per_rank = experts // world
        assert {int(n.split(".")[5]) for n in expert_reads} == set(range(per_rank, 2 * per_rank))


def test_the_device_is_given_only_the_final_dtypes(ckpt, monkeypatch):
    """The model was allocated in fp32 on the device and cast after (twice a bf16 checkpoint's bytes at load: 171 GB
    for the reference's 85 GB single-H200 bf16 slice, session 58's loader review); now every parameter has its final
    dtype before the device allocates it: FP8 Linears, fp32 router and scales, the rest in ``dtype``."""
    from torch import nn

    allocated, to_empty = [], nn.Module.to_empty

    def spy(self, *, device, recurse=True):
        allocated.extend((n, p.dtype) for n, p in self.named_parameters())
        return to_empty(self, device=device, recurse=recurse)

    monkeypatch.setattr(nn.Module, "to_empty", spy)
    load_model(ckpt, dtype=torch.bfloat16, progress=False)
    fp32 = {n for n, d in allocated if d == torch.float32}
    assert allocated and all(n.endswith(("_scale_inv", "mlp.gate.weight", "e_score_correction_bias")) for n in fp32)
