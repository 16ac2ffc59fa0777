"""Training: the optimizer, the train state, a jitted train step, evaluation and `fit`.

One optimizer factory (`make_optimizer`: clip by global norm, then AdamW), one
train step (`train_step`) for the FP32 TFT and for models with extra
non-trainable collections (the QAT model's `quant_stats`), and one loop
(`fit`) with validation, early stopping, checkpoints and `resume`.

This module is the public entry point; the code lives in one module per part:

* `tft_jax.optimizer`: `make_optimizer`, `warmup_cosine_schedule`;
* `tft_jax.train_state`: `Batch`, `TrainState`, `create_train_state`, the
  schedule kept in the state, `copy_state`;
* `tft_jax.steps`: `train_step`, `lower_train_step`, `eval_step`,
  `evaluate`, `predict`;
* `tft_jax.fit`: the loop (its progress report: `tft_jax.fit_progress`).
"""

from __future__ import annotations

from tft_jax.fit import HISTORY_KEYS, FitResult, LoopState, fit, step_key
from tft_jax.optimizer import (
    Optimizer,
    decay_model_params_only,
    make_optimizer,
    warmup_cosine_schedule,
)
from tft_jax.steps import (
    FAST_COMPILE_OPTIONS,
    batch_loss,
    deterministic_output,
    eval_step,
    evaluate,
    lower_train_step,
    predict,
    train_step,
)
from tft_jax.train_state import (
    CATEGORICAL_INPUTS,
    INIT_COMPILE_OPTIONS,
    TRAINABLE_COLLECTIONS,
    Batch,
    ModelApply,
    TrainState,
    copy_state,
    create_train_state,
    in_state_schedule,
    model_inputs,
    with_schedule_steps,
)

__all__ = [
    "CATEGORICAL_INPUTS",
    "FAST_COMPILE_OPTIONS",
    "HISTORY_KEYS",
    "INIT_COMPILE_OPTIONS",
    "TRAINABLE_COLLECTIONS",
    "Batch",
    "FitResult",
    "LoopState",
    "ModelApply",
    "Optimizer",
    "TrainState",
    "batch_loss",
    "copy_state",
    "create_train_state",
    "decay_model_params_only",
    "deterministic_output",
    "eval_step",
    "evaluate",
    "fit",
    "in_state_schedule",
    "lower_train_step",
    "make_optimizer",
    "model_inputs",
    "predict",
    "step_key",
    "train_step",
    "warmup_cosine_schedule",
    "with_schedule_steps",
]
