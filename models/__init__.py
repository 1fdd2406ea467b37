"""GLM-5 model: config, layers, loader, KV cache, checkpoints."""

import importlib.util
from pathlib import Path


def check_kernels_package() -> None:
    """Our ``kernels`` package has the import name of Hugging Face's ``kernels`` distribution (transformers >= 5.25
    depends on it): where theirs is found first, say so here instead of failing later on a missing name."""
    spec = importlib.util.find_spec("kernels")
    ours = Path(__file__).resolve().parent.parent / "kernels"
    found = None if spec is None or spec.origin is None else Path(spec.origin).resolve()
    if found is None or found.parent != ours:
        raise ImportError(f"the module 'kernels' resolves to {found}, not glmserve's {ours}: another package named "
                          "'kernels' (Hugging Face's, which transformers >= 5.25 installs) shadows it; uninstall it "
                          "(pip uninstall kernels) or run from the glmserve checkout")


check_kernels_package()
