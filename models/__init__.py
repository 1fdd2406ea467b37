"""GLM-5 model: config, layers, loader, KV cache, checkpoints."""
