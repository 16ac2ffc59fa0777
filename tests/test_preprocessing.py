"""`tft_jax.data.preprocessing`: vocabularies are the sorted distinct training values, codes
and the unseen-value warning equal each cell looked up alone, and a grid out of series
order transforms as the sorted one."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset
from tft_jax.data.preprocessing import Preprocessor
from tft_jax.data.tables import plain_value


def encode_reference(vocabulary, values: pd.Series) -> tuple[np.ndarray, dict]:
    """Codes and the unseen values (`repr -> value`) of each cell looked up alone."""
    position = {value: code for code, value in enumerate(vocabulary)}
    codes = np.array(
        [position.get(plain_value(v), len(vocabulary)) for v in values], dtype=np.int32
    )
    unseen = {}
    for value, code in zip(values, codes, strict=True):
        if code == len(vocabulary) and not pd.isna(value):
            unseen.setdefault(repr(plain_value(value)), plain_value(value))
    return codes, unseen


@pytest.mark.parametrize(
    "values",
    [
        pd.Series(["a", "zz", None, "b", "a", "zz", np.str_("q")], dtype=object),
        pd.Series([1, 4, None, 2, np.int64(4), 1], dtype=object),
        pd.Series([1, 1.0, "1", 3, None], dtype=object),
        pd.Series(["b", pd.NA, "c"], dtype="string"),
        pd.Series([None, None], dtype=object),
    ],
)
def test_encode_codes_and_warning_are_each_cell_looked_up_alone(values):
    vocabulary = ("a", "b") if values.map(type).eq(str).any() else (1, 2)
    preprocessor = Preprocessor(
        spec=None, series_ids=("s",), origin=pd.Timestamp("2024-01-01"), train_steps=1.0,
        target_scaler=None, feature_scaler=None, vocabularies={"c": vocabulary},
    )  # fmt: skip
    want_codes, unseen = encode_reference(vocabulary, values)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        codes = preprocessor.encode("c", values)
    np.testing.assert_array_equal(codes, want_codes)
    assert codes.dtype == np.int32
    messages = [str(w.message) for w in caught]
    if unseen:
        (message,) = messages
        assert f"[{', '.join(sorted(unseen))}]" in message
    else:
        assert messages == []


def test_vocabularies_are_the_sorted_distinct_training_values():
    times = pd.date_range("2024-01-01", periods=30, freq="D")
    table = pd.concat(
        [
            pd.DataFrame({"id": s, "time": times, "y": np.arange(30.0) + k,
                          "promo": np.where(np.arange(30) % (k + 2) == 0, "on", "off"),
                          "code": (np.arange(30) + k) % 4})
            for k, s in enumerate(["a", "b"])
        ],
        ignore_index=True,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = prepare_dataset(
            table, id_col="id", time_col="time", target="y", freq="D", history=4, horizon=2,
            known_cols=["promo", "code"], categorical_cols=["code"],
        )  # fmt: skip
    train = table[table["time"] < dataset.validation_start]
    vocabularies = dataset.preprocessor.vocabularies
    assert vocabularies == {"code": (0, 1, 2, 3), "promo": ("off", "on")}
    assert vocabularies["code"] == tuple(sorted(set(train["code"].tolist())))
    assert all(type(v) is int for v in vocabularies["code"])


def test_transform_of_a_grid_out_of_series_order_is_that_of_the_sorted_grid():
    times = pd.date_range("2024-01-01", periods=20, freq="D")
    table = pd.concat(
        [pd.DataFrame({"id": s, "time": times, "y": np.arange(20.0) * (k + 1)})
         for k, s in enumerate(["b", "a", "c"])],
        ignore_index=True,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = prepare_dataset(
            table, id_col="id", time_col="time", target="y", freq="D", history=4, horizon=2
        )
    grid = table.assign(y_missing=0.0)
    in_order = dataset.preprocessor.transform(grid.sort_values(["id", "time"], kind="stable"))
    shuffled = dataset.preprocessor.transform(grid)  # series 'b' first
    pd.testing.assert_frame_equal(shuffled.frame, in_order.frame)
    for name in ("series_code", "observed", "known", "target", "series_start"):
        np.testing.assert_array_equal(getattr(shuffled.panel, name), getattr(in_order.panel, name))
    assert shuffled.series_ids == ("a", "b", "c")
