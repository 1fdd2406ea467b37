"""Session 62's fixes. ``routed_scaling_factor`` and ``rms_norm_eps`` are checked as ``rope_theta`` is: a positive
finite number (an infinite or NaN value was taken, and gave NaN logits)."""

from __future__ import annotations

import pytest

from models.config import ConfigError, ModelConfig
from tests.unit.test_mut61_config import base


@pytest.mark.parametrize("key", ["routed_scaling_factor", "rms_norm_eps"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1.0, "1e-5", True])
def test_a_scale_or_eps_must_be_positive_and_finite(key, value):
    with pytest.raises(ConfigError, match=f"config field '{key}' must be a positive number"):
        ModelConfig.from_dict(base(**{key: value}))


def test_an_integer_scale_is_taken_as_a_float():
    cfg = ModelConfig.from_dict(base(routed_scaling_factor=2, rms_norm_eps=None))
    assert cfg.routed_scaling_factor == 2.0 and isinstance(cfg.routed_scaling_factor, float)
    assert cfg.rms_norm_eps == 1e-5             # (null: transformers' default for glm_moe_dsa)
