"""Data preparation: long-format tables to TFT windows; needs no model and no JAX.

Example::

    ds = prepare_dataset(df, id_col="Sensor", time_col="Date_Time", target="Count",
                         freq="h", history=168, horizon=24)
    cfg = TFTConfig(**ds.tft_config_kwargs(), hidden_dim=32, num_heads=4)
    for batch in ds.train.batches(64, seed=epoch):   # dicts of NumPy arrays
        ...
    forecast = ds.inverse_transform(quantiles, batch["series_code"])   # (B, H, Q)
"""

from tft_jax.data.calendar import calendar_feature_names, calendar_features, steps_since
from tft_jax.data.dataset import PreparedDataset, prepare_dataset, split_times
from tft_jax.data.pedestrian import PEDESTRIAN_SPEC, load_pedestrian, prepare_pedestrian
from tft_jax.data.scaling import TARGET_SCALERS, FeatureScaler, TargetScaler
from tft_jax.data.tables import (
    TableSpec,
    parse_frequency,
    read_table,
    to_regular_grid,
    validate_table,
)
from tft_jax.data.windows import MODEL_FIELDS, Panel, WindowSet, batch_indices, window_starts

__all__ = [
    "MODEL_FIELDS",
    "PEDESTRIAN_SPEC",
    "TARGET_SCALERS",
    "FeatureScaler",
    "Panel",
    "PreparedDataset",
    "TableSpec",
    "TargetScaler",
    "WindowSet",
    "batch_indices",
    "calendar_feature_names",
    "calendar_features",
    "load_pedestrian",
    "parse_frequency",
    "prepare_dataset",
    "prepare_pedestrian",
    "read_table",
    "split_times",
    "steps_since",
    "to_regular_grid",
    "validate_table",
    "window_starts",
]
