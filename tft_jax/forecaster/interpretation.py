"""The TFT's interpretation as named tables: variable importances and attention by position.

`interpretation_tables` builds them from a model's `Predictions` (whose weights
are already averaged over windows, heads and steps) and the dataset's variable
labels; `Forecaster.interpretation` runs a model over a split and calls it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from tft_jax.evaluation import Predictions


def _importances(group: str, names: Sequence[str], weights: np.ndarray) -> pd.DataFrame:
    """One row per variable: `variable`, `weight`, in the model's order."""
    names = list(names)
    weights = np.asarray(weights, dtype=np.float64)
    if weights.shape != (len(names),):
        raise ValueError(
            f"{group} weights: {len(names)} variable names {names} for weights of shape "
            f"{weights.shape}; they must match"
        )
    return pd.DataFrame({"variable": pd.Series(names, dtype=object), "weight": weights})


def interpretation_tables(
    predictions: Predictions,
    static_names: Sequence[str],
    history_names: Sequence[str],
    future_names: Sequence[str],
    history: int,
) -> dict[str, pd.DataFrame]:
    """The interpretation of `predictions` as named tables.

    Args:
      predictions: a model's `Predictions` over the windows interpreted.
      static_names: labels of `static_weights` (`PreparedDataset.static_weight_names`).
      history_names: labels of `history_weights`
        (`PreparedDataset.history_weight_names_for`).
      future_names: labels of `future_weights` (`PreparedDataset.future_weight_names`).
      history: `T`, the history length.

    Returns:
      A dict with the keys `static`, `history`, `future` and `attention`:

      - `static`, `history`, `future`: one row per variable in the model's
        order (the order of the labels, not sorted by weight), columns
        `variable` and `weight`. The static weights are averaged over windows;
        the history and future weights over windows and steps (the `T` history
        steps, the `H` horizon steps). Each group's weights sum to 1 (an empty
        group has no rows).
      - `attention`: rows are the horizon steps `1..H` (index `horizon`),
        columns the positions attended (`position`): the lags `-T..-1` of the
        history, then `0..H-1`, the forecast steps themselves (decoder
        positions). Averaged over windows and heads; each row sums to 1 over
        all `T+H` positions, and is 0 on the positions after its own step
        (causal mask; with `TFTConfig.attend_to_self=False` on its own too).

    Raises:
      ValueError: when the labels or `history` do not match the weights' shapes.
    """
    attention = np.asarray(predictions.attention, dtype=np.float64)
    if attention.ndim != 2 or attention.shape[1] != history + attention.shape[0]:
        raise ValueError(
            f"attention must have shape (H, T+H) with T={history}, got {attention.shape}"
        )
    steps = attention.shape[0]
    return {
        "static": _importances("static", static_names, predictions.static_weights),
        "history": _importances("history", history_names, predictions.history_weights),
        "future": _importances("future", future_names, predictions.future_weights),
        "attention": pd.DataFrame(
            attention,
            index=pd.RangeIndex(1, steps + 1, name="horizon"),
            columns=pd.Index(np.arange(-history, steps), name="position"),
        ),
    }
