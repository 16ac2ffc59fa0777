"""`jax.export` of the TFT with a symbolic batch: one artifact serves every batch size.

The history selection counts its CPU chunks from the number of rows, and the
attention checked its shapes with NumPy: both needed a concrete batch size
and failed the export with a ConcretizationTypeError / TypeError.
"""

from __future__ import annotations

import jax
import numpy as np
from jax import export

from tft_jax import TemporalFusionTransformer, TFTConfig

CONFIG = TFTConfig(
    num_static_features=2, num_known_features=2, num_observed_features=3, hidden_dim=8,
    num_heads=2, sequence_length=3, prediction_horizon=2,
)  # fmt: skip


def inputs(batch: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(batch, 2)).astype(np.float32),
        rng.normal(size=(batch, 3, 3)).astype(np.float32),
        rng.normal(size=(batch, 2, 2)).astype(np.float32),
    )


def test_a_tft_exported_with_a_symbolic_batch_forecasts_any_batch_as_apply_does():
    model = TemporalFusionTransformer(CONFIG)
    # Init and the reference jitted: op by op they compiled ~470 one-primitive programs.
    variables = jax.jit(model.init)(jax.random.key(0), *inputs(2, 0))

    @jax.jit
    def forecast(variables, static, history, future):
        return model.apply(variables, static, history, future, deterministic=True).quantiles

    (batch,) = export.symbolic_shape("b")
    specs = [jax.ShapeDtypeStruct((batch, *x.shape[1:]), x.dtype) for x in inputs(1, 0)]
    exported = export.export(forecast)(variables, *specs)
    batch_inputs = inputs(3, 1)  # neither the batch of init nor of the specs' example
    np.testing.assert_allclose(
        np.asarray(exported.call(variables, *batch_inputs)),
        np.asarray(forecast(variables, *batch_inputs)),  # compiled for the concrete batch 3
        rtol=1e-5,
        atol=1e-6,
    )
