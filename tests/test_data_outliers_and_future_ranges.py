"""A few extreme target values that set a series' scale, and future known values far from
the training ones, are announced naming series, time and value (`tft_jax.data.scaling`,
`tft_jax.data.future`); ordinary series and values stay silent."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import FeatureScaler, TargetScaler, prepare_dataset
from tft_jax.data.future import future_windows

from .prepared_tables import HISTORY, HORIZON, quiet_prepare

EXTREME = "farther from their median"


def caught_messages(run) -> tuple[object, list[str]]:
    """`run()`'s result and the messages of the user warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run()
    return result, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def extreme_warnings(values: np.ndarray, method: str = "standard") -> list[str]:
    """The extreme-value warnings of fitting one series on `values`."""
    codes = np.zeros(values.size, dtype=int)
    _, messages = caught_messages(lambda: TargetScaler.fit(values, codes, 1, method))
    return [message for message in messages if EXTREME in message]


def test_a_single_huge_value_that_sets_the_standard_scale_is_named_with_its_time():
    # Rows shuffled across series: the time named must be the value's own.
    rng = np.random.default_rng(0)
    times = pd.date_range("2024-01-01", periods=100, freq="D")
    normal = 100.0 + 10.0 * rng.standard_normal(100)
    spiked = normal.copy()
    spiked[37] = 1e30
    values = np.concatenate([normal, spiked])
    codes = np.repeat([0, 1], 100)
    all_times = times.append(times)
    order = rng.permutation(200)
    scaler, messages = caught_messages(
        lambda: TargetScaler.fit(
            values[order], codes[order], 2, "standard",
            series_names=["quiet", "shop"], times=all_times[order],
        )
    )  # fmt: skip
    (message,) = [m for m in messages if EXTREME in m]
    assert message.startswith("scaler='standard': 1 series have")
    assert "'shop' 1e+30 at 2024-02-07 00:00:00" in message
    assert "'quiet'" not in message
    # The scale with and without it, from numpy: the fit itself is unchanged (announced only).
    assert f"scale {np.std(spiked):.4g}, {np.std(np.delete(spiked, 37)):.4g} without it" in message
    assert "scaler='robust'" in message and "--scaler robust" in message
    assert scaler.scale[1] == pytest.approx(np.std(spiked))


def test_without_times_the_extreme_value_is_named_by_its_position_among_the_series_rows():
    values = 5.0 + np.sin(np.arange(30.0))
    values[3] = np.nan  # counted: the position is the row's among the series' rows
    values[12] = -1e30
    (message,) = extreme_warnings(values)
    assert "0 -1e+30 at position 12 of its values" in message


def test_the_mean_abs_scale_set_by_one_value_is_announced_and_the_robust_one_is_not():
    values = 50.0 + np.random.default_rng(1).standard_normal(60)
    values[5] = 1e30
    assert len(extreme_warnings(values, "mean_abs")) == 1
    assert extreme_warnings(values, "robust") == []
    robust = TargetScaler.fit(values, np.zeros(60, dtype=int), 1, "robust")
    q25, q75 = np.percentile(values, [25, 75])
    assert robust.scale[0] == pytest.approx(q75 - q25)


def test_a_series_with_several_extreme_values_is_counted_once_in_one_warning():
    rng = np.random.default_rng(2)
    values = np.concatenate([10.0 + rng.standard_normal(200) for _ in range(8)])
    for series in range(8):  # every series two extreme values: one warning listing 5 of 8
        values[series * 200 + 10] = 1e25
        values[series * 200 + 90] = -3e24
    codes = np.repeat(np.arange(8), 200)
    _, messages = caught_messages(lambda: TargetScaler.fit(values, codes, 8, "standard"))
    (message,) = [m for m in messages if EXTREME in m]
    assert message.startswith("scaler='standard': 8 series have")
    assert "0 1e+25 at position 10 of its values (and 1 more such value)" in message
    assert "and 3 more;" in message


def realistic_series(seed: int, length: int) -> dict[str, np.ndarray]:
    """Ordinary series whose largest values are no errors: none sets its scale alone."""
    rng = np.random.default_rng(seed)
    steps = np.arange(length)
    return {
        "trend": 5.0 + 0.3 * steps + rng.standard_normal(length),
        "weekly season": 100.0 + 30.0 * np.sin(2 * np.pi * steps / 7) + rng.standard_normal(length),
        "intermittent": np.where(rng.random(length) < 0.1, rng.integers(1, 50, length), 0.0),
        "one sale": np.where(steps == length // 2, 400.0, 0.0),
        "promotion spikes": 10.0 + rng.standard_normal(length) + 200.0 * (steps % 31 == 0),
        "log-normal": np.exp(2.0 * rng.standard_normal(length)),
        "growth": 1.1 ** np.minimum(steps, 200) * (1.0 + 0.05 * rng.standard_normal(length)),
        "level shift": np.where(steps > 0.7 * length, 1e4, 10.0) + rng.standard_normal(length),
        "random walk": np.cumsum(rng.standard_normal(length)),
        "closed at night": np.where(steps % 24 < 6, 0.0, 500.0 + 100.0 * rng.random(length)),
    }


@pytest.mark.parametrize("method", ["standard", "mean_abs"])
@pytest.mark.parametrize("length", [10, 120, 1000])
def test_trending_seasonal_intermittent_and_spiky_series_are_not_called_extreme(method, length):
    for seed in range(5):
        for name, values in realistic_series(seed, length).items():
            assert extreme_warnings(values, method) == [], (name, seed)


def test_prepare_dataset_names_the_series_and_value_of_a_huge_training_target():
    rng = np.random.default_rng(3)
    times = pd.date_range("2024-01-01", periods=120, freq="D")
    table = pd.concat(
        [
            pd.DataFrame({"id": series, "time": times, "y": 100.0 + 10.0 * rng.random(120)})
            for series in "abcd"
        ],
        ignore_index=True,
    )
    table.loc[(table["id"] == "c") & (table["time"] == "2024-01-11"), "y"] = 1e30
    options = dict(id_col="id", time_col="time", target="y", freq="D", history=14, horizon=7)
    _, messages = caught_messages(lambda: prepare_dataset(table, **options))
    (message,) = [m for m in messages if EXTREME in m]
    assert "'c' 1e+30 at 2024-01-11 00:00:00" in message and "scaler='robust'" in message
    _, robust = caught_messages(lambda: prepare_dataset(table, scaler="robust", **options))
    assert not [m for m in robust if EXTREME in m]


def test_a_new_series_whose_history_holds_a_huge_value_is_announced_at_predict_as_at_fit():
    # Its scaler is fitted on its own history at predict: a 1e30 typo set that scale
    # silently (forecasts of ~1e28 for values near 100), where fit announced the same.
    table = feature_table()
    fitted = preprocessor_of(table)
    new = table[table["id"] == "a"].assign(id="n")
    new.loc[new.index[30], "y"] = 1e30
    history = pd.concat([table, new], ignore_index=True)
    future = future_of(history)
    _, messages = caught_messages(lambda: future_windows(fitted, history, future, HISTORY, HORIZON))
    (message,) = [m for m in messages if EXTREME in m]
    assert message.startswith("scaler='standard': 1 series have a few values in the history given")
    assert f"'n' 1e+30 at {new['time'].iloc[30]}" in message
    values = new["y"].to_numpy()
    assert f"scale {np.std(values):.4g}, {np.std(np.delete(values, 30)):.4g} without it" in message
    # A trained series with the same value is scaled by its training fit: nothing to tell.
    plain = future_of(table)
    _, trained = caught_messages(lambda: future_windows(fitted, table, plain, HISTORY, HORIZON))
    assert not [m for m in trained if EXTREME in m]


def feature_table(series: str = "ab", length: int = 40) -> pd.DataFrame:
    """Daily series with an observed 'temp' in [100, 200], a known 0/1 'promo' and a known
    'flat' constant at 1 over the whole table."""
    rng = np.random.default_rng(4)
    times = pd.date_range("2024-01-01", periods=length, freq="D")
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "id": name,
                    "time": times,
                    "y": 10.0 + rng.standard_normal(length),
                    "temp": 100.0 + 100.0 * rng.random(length),
                    "promo": np.arange(length) % 2 * 1.0,
                    "flat": 1.0,
                }
            )
            for name in series
        ],
        ignore_index=True,
    )


def preprocessor_of(table: pd.DataFrame):
    return quiet_prepare(
        table, freq="D", history=HISTORY, horizon=HORIZON,
        known_cols=["promo", "flat"], observed_cols=["temp"],
    ).preprocessor  # fmt: skip


def future_of(table: pd.DataFrame, promo: float = 1.0, flat: float = 1.0) -> pd.DataFrame:
    last = table.groupby("id")["time"].max()
    rows = [
        (series, time, promo, flat)
        for series, end in last.items()
        for time in pd.date_range(end, periods=HORIZON + 1, freq="D")[1:]
    ]
    return pd.DataFrame(rows, columns=["id", "time", "promo", "flat"])


def future_messages(preprocessor, table: pd.DataFrame, future: pd.DataFrame) -> list[str]:
    _, messages = caught_messages(
        lambda: future_windows(preprocessor, table, future, HISTORY, HORIZON)
    )
    return [m for m in messages if m.startswith("future known column")]


def test_feature_scaler_keeps_each_columns_training_range_ignoring_nan():
    values = np.array([[1.0, np.nan], [np.nan, -2.0], [3.0, 7.0], [2.0, 5.0]])
    scaler = FeatureScaler.fit(values)
    np.testing.assert_array_equal(scaler.low, np.nanmin(values, axis=0))
    np.testing.assert_array_equal(scaler.high, np.nanmax(values, axis=0))
    np.testing.assert_array_equal(scaler.constant, [False, False])
    assert FeatureScaler.fit(np.full((5, 1), 0.1)).constant.tolist() == [True]


def test_a_future_value_of_a_column_constant_in_training_is_named_with_that_constant():
    table = feature_table()
    preprocessor = preprocessor_of(table)
    future = future_of(table)
    future.loc[future["id"] == "b", "flat"] = 2.0
    (message,) = future_messages(preprocessor, table, future)
    assert message.startswith(
        "future known column 'flat' was constant at 1 in the training period, but future "
        "gives it other values (2 values in 1 series): series 'b' at 2024-02-10 00:00:00: 2; "
        "series 'b' at 2024-02-11 00:00:00: 2;"
    )
    assert "Give 1 there, or retrain" in message


def test_a_future_value_far_outside_the_training_range_is_named_with_the_range():
    # 'promo' is the scaler's second column (after the observed 'temp' in [100, 200]):
    # 150 lies within temp's range but far outside promo's [0, 1].
    table = feature_table()
    preprocessor = preprocessor_of(table)
    future = future_of(table)
    future.loc[1, "promo"] = 150.0
    future.loc[2, "promo"] = -1000.0
    (message,) = future_messages(preprocessor, table, future)
    assert message.startswith(
        "future known column 'promo' holds 2 values in 2 series far outside its training "
        "range [0, 1] (beyond it by more than its width 1): series 'a' at 2024-02-11 "
        "00:00:00: 150; series 'b' at 2024-02-10 00:00:00: -1000;"
    )


@pytest.mark.parametrize(("promo", "flat"), [(0.0, 1.0), (1.0, 1.0), (2.0, 1.0), (-0.9, 1.0)])
def test_future_values_within_or_slightly_beyond_the_training_range_are_silent(promo, flat):
    table = feature_table()
    preprocessor = preprocessor_of(table)
    assert future_messages(preprocessor, table, future_of(table, promo, flat)) == []


def test_far_future_values_of_many_series_give_one_warning_per_column():
    table = feature_table(series="abcdefghij")
    preprocessor = preprocessor_of(table)
    messages = future_messages(preprocessor, table, future_of(table, promo=1000.0, flat=3.0))
    assert len(messages) == 2
    assert all("and 15 more;" in message for message in messages)


def test_a_preprocessor_without_training_ranges_compares_nothing():
    # A scaler made without ranges (a run saved before they were kept) loads and forecasts.
    table = feature_table()
    fitted = preprocessor_of(table)
    old = dataclasses.replace(
        fitted,
        feature_scaler=FeatureScaler(fitted.feature_scaler.loc, fitted.feature_scaler.scale),
    )
    assert old.feature_scaler.far_outside(np.ones((1, 1)), np.array([0])) is None
    assert future_messages(old, table, future_of(table, promo=1000.0, flat=3.0)) == []


def test_a_saved_and_loaded_preprocessor_keeps_the_ranges_and_an_older_one_still_loads():
    import json

    from tft_jax.data.preprocessing import Preprocessor

    table = feature_table()
    fitted = preprocessor_of(table)
    saved = json.loads(json.dumps(fitted.to_json()))
    loaded = Preprocessor.from_json(saved)
    np.testing.assert_array_equal(loaded.feature_scaler.low, fitted.feature_scaler.low)
    np.testing.assert_array_equal(loaded.feature_scaler.high, fitted.feature_scaler.high)
    (message,) = future_messages(loaded, table, future_of(table, flat=3.0))
    assert message.startswith("future known column 'flat' was constant at 1")
    for bound in ("low", "high"):  # a config.json written before the ranges were kept
        del saved["feature_scaler"][bound]
    older = Preprocessor.from_json(saved)
    assert older.feature_scaler.low is None and older.feature_scaler.high is None
    assert future_messages(older, table, future_of(table, flat=3.0)) == []
