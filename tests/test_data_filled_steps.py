"""Empty cells and filled steps: a series' leading empty target and observed cells never take
a later value, an input first seen after training is named, and a split without windows
says when its windows were left out for filled steps.

References are plain pandas (forward fill) and float64 NumPy (mean, population std).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data.future import future_windows

from .prepared_tables import HISTORY, HORIZON, prepare

LEADING = 6  # empty target and observed cells at the start of series 'a'


def leading_empty_table() -> pd.DataFrame:
    """Two daily series; 'a' has its first LEADING target and 'o' cells empty (rows present)."""
    parts = []
    for number, series in enumerate(("a", "b")):
        steps = np.arange(30.0)
        parts.append(
            pd.DataFrame(
                {
                    "id": series,
                    "time": pd.date_range("2024-01-01", periods=30, freq="D"),
                    "y": 100.0 * (number + 1) + steps**2,
                    "o": np.cos(steps) + 3.0 * steps,
                    "oc": np.where(steps % 2 == 0, "even", "odd"),
                }
            )
        )
    table = pd.concat(parts, ignore_index=True)
    leading = (table["id"] == "a") & (
        table["time"] < pd.Timestamp("2024-01-01") + LEADING * pd.Timedelta("1D")
    )
    table.loc[leading, ["y", "o"]] = np.nan
    table.loc[leading, "oc"] = None
    return table


@pytest.fixture(scope="module")
def leading_empty():
    """The prepared table and the messages of the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = prepare(leading_empty_table(), observed_cols=["o", "oc"])
    return dataset, [str(w.message) for w in caught]


def reference_history(dataset, table: pd.DataFrame, column: str, scale_rows) -> dict:
    """Per series, the scaled float64 history input of `column`: forward fill, 0 before a value.

    The location and scale are the mean and population std of the column's
    values on `scale_rows` (the training rows, as the scaler is fitted).
    """
    result = {}
    for series, rows in table.groupby("id"):
        values = rows[column].to_numpy(np.float64)
        fitted = rows.loc[scale_rows(rows), column].dropna().to_numpy(np.float64)
        loc, scale = fitted.mean(), fitted.std()
        filled = pd.Series(values).ffill().to_numpy()
        result[series] = np.where(np.isnan(filled), 0.0, (filled - loc) / scale)
    return result


def test_leading_empty_target_never_carries_a_later_value_into_the_history(leading_empty):
    dataset, _ = leading_empty
    table = leading_empty_table()
    train_rows = lambda rows: rows["time"] < dataset.validation_start  # noqa: E731
    expected = reference_history(dataset, table, "y", train_rows)
    panel = dataset.panel
    for name in ("train", "validation", "test"):
        windows = dataset.split(name)
        arrays = windows.arrays()
        for number, start in enumerate(windows.starts):
            code = int(panel.series_code[start])
            offset = int(start - panel.series_start[code])
            series = dataset.series_ids[code]
            want = expected[series][offset - HISTORY : offset]
            np.testing.assert_allclose(arrays["historical"][number, :, 0], want, atol=1e-5)
    # The first window of 'a' sees only empty steps: none of them is its horizon's target.
    first = dataset.train.take(np.array([0]))
    assert dataset.series_ids[int(first["series_code"][0])] == "a"
    assert not np.isin(first["target"][0], first["historical"][0, :, 0]).any()


def test_leading_empty_observed_input_is_the_training_mean_not_a_later_value(leading_empty):
    dataset, messages = leading_empty
    table = leading_empty_table()
    train_rows = lambda rows: rows["time"] < dataset.validation_start  # noqa: E731
    # The feature scaler is shared by all series: fitted on every training row.
    fitted = table.loc[train_rows(table), "o"].dropna().to_numpy(np.float64)
    loc, scale = fitted.mean(), fitted.std()
    panel = dataset.panel
    a_rows = slice(int(panel.series_start[0]), int(panel.series_start[0] + panel.series_length[0]))
    given = table.loc[table["id"] == "a", "o"].ffill().to_numpy(np.float64)
    want = np.where(np.isnan(given), 0.0, (given - loc) / scale)
    np.testing.assert_allclose(panel.observed[a_rows, 1], want, atol=1e-5)
    # The categorical observed input is unknown there, not a later category.
    unknown = len(dataset.preprocessor.vocabularies["oc"])
    assert (panel.observed_categorical[a_rows, 0][:LEADING] == unknown).all()
    assert (panel.observed_categorical[a_rows, 0][LEADING:] < unknown).all()
    assert not any("not seen in training" in message for message in messages)
    filled = [m for m in messages if "empty cells of known/observed" in m]
    assert len(filled) == 1 and "set to the training mean" in filled[0]


def test_forecast_from_a_history_with_leading_empty_target_is_finite(leading_empty):
    dataset, _ = leading_empty
    history = leading_empty_table().groupby("id").head(LEADING + 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        future = future_windows(
            dataset.preprocessor, history, None, LEADING + 2, HORIZON, max_missing_fraction=1.0
        )
    arrays = future.windows.arrays()
    assert np.isfinite(arrays["historical"]).all()
    a = dataset.series_ids.index("a")
    np.testing.assert_array_equal(arrays["historical"][a, :LEADING, 0], 0.0)


def test_an_observed_column_first_seen_after_the_training_period_is_named():
    # A sensor added later: before, its cells were back-filled from validation values
    # (the future); without that, its scaler had no value and the error named nothing.
    table = leading_empty_table()
    table.loc[table["time"] < "2024-01-25", "o"] = np.nan
    with pytest.raises(ValueError, match=r"columns \['o'\] have no value before validation_start"):
        prepare(table, observed_cols=["o", "oc"])


def test_no_window_error_names_windows_left_out_for_filled_steps():
    # Business-day data given freq="D": each weekend is two filled rows; the validation
    # period Fri-Sun has 2 windows per series, all with a weekend step in their horizon.
    times = pd.bdate_range("2024-01-01", periods=24)
    table = pd.concat(
        [
            pd.DataFrame({"id": s, "time": times, "y": np.arange(24.0) + k})
            for k, s in enumerate("ab")
        ]
    )
    with pytest.raises(
        ValueError, match=r"validation period .* 4 windows all have a filled target"
    ):
        prepare(table, validation_start="2024-01-26", test_start="2024-01-29")
