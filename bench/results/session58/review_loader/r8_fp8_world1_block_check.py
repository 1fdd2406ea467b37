"""_check_tp_divisible (models/loader.py:104-115) demands MLP widths in whole 128-column FP8 blocks times the world
size even when world_size == 1 (nothing is split). An FP8 checkpoint whose moe_intermediate_size is not a multiple of
128 (legal: its scales just have a partial last block, which the loader handles for every other Linear) is refused
with "cannot be split over 1 ranks". Exit 1 while load_model refuses it at world size 1."""
import torch
from _common import *
from models.checkpoint import write_checkpoint
from models.config import ModelConfig
from models.loader import load_model


def main():
    cfg = ModelConfig.from_dict(dict(TINY, moe_intermediate_size=96, intermediate_size=320))
    d = fresh("r8_fp8_96")
    write_checkpoint(d, cfg, seed=0, fp8=True, num_shards=2)
    try:
        m = load_model(d, dtype=torch.float32, progress=False)
    except ValueError as e:
        print("refused at world_size 1:", e)
        return 1
    print("loaded; fp8 params:", sum(p.dtype == torch.float8_e4m3fn for p in m.parameters()))
    return 0


run(main)
