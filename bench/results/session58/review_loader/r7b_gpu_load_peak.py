"""GPU confirmation of r7: load a ~400 MB bf16 checkpoint with load_model(dtype=bfloat16, device='cuda') and compare
torch.cuda.max_memory_allocated with the final parameter bytes. Exit 1 while peak > 1.1x final (2 without a GPU)."""
import json, sys, torch
sys.path.insert(0, ".")
from models.checkpoint import write_checkpoint
from models.config import ModelConfig
from models.loader import load_model

if not torch.cuda.is_available():
    print("no GPU"); sys.exit(2)
tiny = json.load(open("models/configs/glm5-tiny-random.json"))
small = dict(tiny, vocab_size=65536, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=256,
             num_hidden_layers=4, mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
             indexer_types=["full", "shared", "full", "shared"])
p = "/tmp/r7b_bf16"
write_checkpoint(p, ModelConfig.from_dict(small), seed=0, dtype="bfloat16")
torch.cuda.reset_peak_memory_stats()
m = load_model(p, dtype=torch.bfloat16, device="cuda", progress=False)
torch.cuda.synchronize()
final = sum(q.numel() * q.element_size() for q in m.parameters())
peak = torch.cuda.max_memory_allocated()
print(f"{torch.cuda.get_device_name()}: params {final/1e6:.0f} MB, cuda peak allocated during load {peak/1e6:.0f} MB "
      f"({peak/final:.2f}x)")
sys.exit(1 if peak > 1.1 * final else 0)
