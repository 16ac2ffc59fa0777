"""Third review of the data path, as a user with messy tables: what leaks from a series'
first value back into earlier steps, and what a refusal says when the cause is filled steps.

References are plain pandas (forward fill) and float64 NumPy (mean, population std).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset
from tft_jax.data.future import future_windows

HISTORY, HORIZON = 4, 2


def prepare(table: pd.DataFrame, freq: str = "D", **options: Any) -> Any:
    """`prepare_dataset` with this file's columns ('id', 'time', 'y'), history and horizon."""
    return prepare_dataset(
        table, id_col="id", time_col="time", target="y", freq=freq, history=HISTORY,
        horizon=HORIZON, **options,
    )  # fmt: skip


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


def daily_pair(n: int = 30) -> pd.DataFrame:
    """Two gapless daily series with a linear target."""
    times = pd.date_range("2024-01-01", periods=n, freq="D")
    return pd.concat(
        [
            pd.DataFrame({"id": s, "time": times, "y": np.arange(n) + 100.0 * k})
            for k, s in enumerate("ab")
        ],
        ignore_index=True,
    )


def test_a_pandas_category_column_of_codes_is_a_categorical_input():
    table = daily_pair()
    store_type = pd.Series(np.arange(len(table)) % 3 + 1).astype("category")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset = prepare(table.assign(kind=store_type), known_cols=["kind"])
    assert "kind" not in dataset.known_feature_names
    assert dataset.known_categorical_names == ("kind",)
    assert dataset.preprocessor.vocabularies["kind"] == (1, 2, 3)
    # The code of value v is its position in (1, 2, 3).
    np.testing.assert_array_equal(dataset.panel.known_categorical[:, 0], store_type.to_numpy() - 1)


def test_a_period_time_column_is_refused_with_the_conversion_to_use():
    table = daily_pair().assign(time=lambda t: t["time"].dt.to_period("D"))
    with pytest.raises(
        ValueError, match=r"column 'time' holds periods \(period\[D\]\).*to_timestamp"
    ):
        prepare(table)


def test_naive_local_times_repeating_the_dst_hour_are_told_how_to_localize():
    # Berlin's clocks went back at 03:00 on 2024-10-27: naive local times hold 02:00 twice.
    local = pd.date_range("2024-10-26 20:00", periods=12, freq="h", tz="Europe/Berlin")
    table = pd.DataFrame({"id": "a", "time": local.tz_localize(None), "y": np.arange(12.0)})
    with pytest.raises(
        ValueError, match=r"2 rows repeat .* at 2024-10-27 02:00:00.*ambiguous='infer'"
    ):
        prepare(table, "h")
    # The advice works: localized, the table is prepared with every hour once.
    table["time"] = table["time"].dt.tz_localize("Europe/Berlin", ambiguous="infer")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset = prepare(
            table, "h", timezone="Europe/Berlin", validation_fraction=0.0, test_fraction=0.0
        )
    assert len(dataset.frame) == 12


def known_table() -> pd.DataFrame:
    """Two daily series of 30 steps with a real known column 'promo'."""
    times = pd.date_range("2024-01-01", periods=30, freq="D")
    return pd.concat(
        [
            pd.DataFrame(
                {"id": s, "time": times, "y": np.arange(30.0) * (k + 1), "promo": np.arange(30) % 2}
            )
            for k, s in enumerate("ab")
        ],
        ignore_index=True,
    )


@pytest.fixture(scope="module")
def known_dataset():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return prepare(known_table(), known_cols=["promo"])


def test_forecast_refusals_name_what_a_fitted_model_lets_the_user_change(known_dataset):
    table = known_table()
    future = pd.DataFrame(
        {
            "id": np.repeat(["a", "b"], HORIZON),
            "time": np.tile(pd.date_range("2024-01-31", periods=HORIZON, freq="D"), 2),
            "promo": ["x", 1] * HORIZON,
        }
    )
    # A text in a known column of the future: the column by its own name, a usable hint.
    with pytest.raises(ValueError) as caught:
        future_windows(known_dataset.preprocessor, table, future, HISTORY, HORIZON)
    message = str(caught.value)
    assert message.startswith("future table: column 'promo' has 2 non-numeric values")
    assert "'future promo'" not in message
    # A series too short to forecast from: the fitted history is fixed, so the fix is data.
    short = pd.concat([table, table[table["id"] == "a"].head(2).assign(id="c")])
    with pytest.raises(ValueError) as caught:
        future_windows(known_dataset.preprocessor, short, None, HISTORY, HORIZON)
    message = str(caught.value)
    assert "'c' (2 steps)" in message
    assert f"give each of them at least {HISTORY} steps of history, or drop them" in message
    assert "shorten history/horizon" not in message
    # Too sparse recently: the limit is named where a Forecaster user sets it.
    sparse = table.copy()
    sparse.loc[(sparse["id"] == "a") & (sparse["time"] >= "2024-01-27"), "y"] = np.nan
    sparse = sparse[~((sparse["id"] == "a") & (sparse["time"] == "2024-01-30"))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with pytest.raises(ValueError, match=r"max_missing_fraction, which a Forecaster takes "
                           r"from its DataConfig"):  # fmt: skip
            future_windows(known_dataset.preprocessor, sparse, None, HISTORY, HORIZON)


def test_an_observed_column_first_seen_after_the_training_period_is_named():
    # A sensor added later: before, its cells were back-filled from validation values
    # (the future); without that, its scaler had no value and the error named nothing.
    table = leading_empty_table()
    table.loc[table["time"] < "2024-01-25", "o"] = np.nan
    with pytest.raises(ValueError, match=r"columns \['o'\] have no value before validation_start"):
        prepare(table, observed_cols=["o", "oc"])


def test_a_utc_history_is_forecast_on_the_training_zones_days_across_a_dst_change():
    # Trained on Berlin midnights (no `timezone`): the same instants in UTC are 23:00 in
    # winter and 22:00 in summer, off any UTC daily grid. The README promises such a
    # history is forecast exactly as in the training zone; it was refused as off the grid
    # (spanning the change) or stepped in 24-hour UTC days (the 7 steps crossing it).
    days = pd.date_range("2024-03-01", "2024-04-12", freq="D", tz="Europe/Berlin")
    table = pd.DataFrame({"id": "a", "time": days, "y": np.sin(np.arange(len(days)) / 3.0)})
    dataset = prepare(table)
    for end in ("2024-03-29", "2024-04-06"):  # horizon crossing the change; history spanning it
        berlin = table[table["time"] < pd.Timestamp(end, tz="Europe/Berlin")]
        utc = berlin.assign(time=berlin["time"].dt.tz_convert("UTC"))
        local = future_windows(dataset.preprocessor, berlin, None, HISTORY, HORIZON)
        given = future_windows(dataset.preprocessor, utc, None, HISTORY, HORIZON)
        assert str(given.last_times.tz) == "UTC"  # the forecast keeps the zone it was given
        assert given.last_times.tz_convert("Europe/Berlin").equals(local.last_times)
        times = given.windows.panel.times
        assert times.tz_convert("Europe/Berlin").equals(local.windows.panel.times)
        for name, array in local.windows.arrays().items():
            np.testing.assert_array_equal(given.windows.arrays()[name], array, err_msg=name)


def test_dates_written_as_digits_are_read_by_the_time_format_given():
    days = pd.date_range("2024-01-25", periods=20, freq="D")
    table = pd.DataFrame({"id": "a", "time": days, "y": np.arange(20.0)})
    digits = table.assign(time=days.strftime("%Y%m%d").astype(np.int64))  # as read_csv reads them
    assert digits["time"].iloc[0] == 20240125
    expected = prepare(table).train.panel.times
    got = prepare(digits, time_format="%Y%m%d").train.panel.times
    assert got.equals(expected)
    # Without a format the numbers are refused, with both readings offered (unit='s'
    # alone made 20240125 into 1970-08-23).
    with pytest.raises(ValueError, match=r"holds numbers \(int64\).*time_format='%Y%m%d'"):
        prepare(digits)
