"""Categorical columns read the same whatever pandas dtype holds their values."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset
from tft_jax.data.future import future_windows

HISTORY, HORIZON = 4, 2
SPEC = dict(id_col="id", time_col="time", target="y", freq="h", known_cols=["shift"],
            categorical_cols=["shift"], history=HISTORY, horizon=HORIZON)  # fmt: skip


def shifts(n: int = 40, seed: int = 0) -> pd.DataFrame:
    """Two hourly series with a known integer-coded 'shift' (0, 1 or 2), as int64."""
    rng = np.random.default_rng(seed)
    times = pd.date_range("2021-03-01", periods=n, freq="h")
    return pd.concat(
        [pd.DataFrame({"id": s, "time": times, "y": rng.normal(size=n),
                       "shift": np.arange(n) % 3}) for s in "ab"],
        ignore_index=True,
    )  # fmt: skip


def test_integer_categories_code_as_the_same_integers_in_int64():
    table = shifts()
    as_category = table.assign(shift=table["shift"].astype("category"))
    fitted = prepare_dataset(as_category, **SPEC)
    # The vocabulary holds the integers themselves, as with an int64 column.
    assert fitted.preprocessor.vocabularies["shift"] == (0, 1, 2)
    expected = prepare_dataset(table, **SPEC)
    np.testing.assert_array_equal(fitted.panel.known_categorical,
                                  expected.panel.known_categorical)  # fmt: skip
    # Predicting from the int64 values (e.g. read back from a CSV) codes them as
    # in training: no value is unknown, so there is no warning.
    history = table[table["time"] >= table["time"].iloc[20]]
    future = pd.DataFrame(
        [(s, t, k % 3) for s in "ab" for k, t in enumerate(
            pd.date_range(table["time"].max() + pd.Timedelta(hours=1), periods=HORIZON,
                          freq="h"))],
        columns=["id", "time", "shift"],
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ahead = future_windows(fitted.preprocessor, history, future, HISTORY, HORIZON)
    got = ahead.windows.panel.known_categorical
    reference = future_windows(expected.preprocessor, history, future, HISTORY, HORIZON)
    np.testing.assert_array_equal(got, reference.windows.panel.known_categorical)
    # An independent reference: the code of value v is its position in (0, 1, 2),
    # never the unknown code 3.
    assert set(np.unique(got).tolist()) == {0, 1, 2}


def test_integer_categories_with_empty_cells_and_fractional_categories():
    table = shifts()
    codes = table["shift"].astype("float64")
    codes[codes.index[5]] = np.nan
    with pytest.warns(UserWarning, match="filled 1 empty cells"):
        fitted = prepare_dataset(table.assign(shift=codes.astype("category")), **SPEC)
    assert fitted.preprocessor.vocabularies["shift"] == (0, 1, 2)  # not '0.0', '1.0', '2.0'
    halves = table.assign(shift=(table["shift"] + 0.5).astype("category"))
    with pytest.raises(ValueError, match=r"categorical column 'shift' has non-integer codes, "
                       r"e\.g\. 0\.5 in series 'a' at row 0"):  # fmt: skip
        prepare_dataset(halves, **SPEC)
