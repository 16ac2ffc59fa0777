"""Tests of `tft_jax.data`: validation, regular grid, calendar, scaling, windows, split, loader."""

from __future__ import annotations

import ast
import pathlib
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tft_jax.data import (
    FeatureScaler,
    TableSpec,
    TargetScaler,
    batch_indices,
    calendar_feature_names,
    calendar_features,
    load_pedestrian,
    prepare_dataset,
    prepare_pedestrian,
    steps_since,
    to_regular_grid,
    validate_table,
)
from tft_jax.data.dataset import split_times
from tft_jax.data.windows import WINDOW_SCALE_FLOOR

SPEC = dict(
    id_col="id",
    time_col="time",
    target="y",
    static_cols=["size"],
    known_cols=["promo"],
    observed_cols=["temp"],
    freq="h",
)
STEP = pd.Timedelta(hours=1)


def make_table(lengths: dict[str, int] | None = None, seed: int = 0) -> pd.DataFrame:
    """A gapless hourly long table; series k starts k*5 hours after the first."""
    lengths = lengths or {"a": 80, "b": 64}
    rng = np.random.default_rng(seed)
    parts = []
    for k, (series, n) in enumerate(lengths.items()):
        times = pd.date_range("2021-03-01", periods=n, freq="h", tz="UTC") + 5 * k * STEP
        parts.append(
            pd.DataFrame(
                {
                    "id": series,
                    "time": times,
                    "y": 100.0 * (k + 1) + rng.normal(0.0, 10.0 * (k + 1), n),
                    "size": float(k + 2),
                    "promo": rng.integers(0, 2, n).astype(float),
                    "temp": rng.normal(20.0, 5.0, n),
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


def prepare(table: pd.DataFrame, **options) -> object:
    return prepare_dataset(table, **{**SPEC, "history": 6, "horizon": 3, **options})


def rows_of(table: pd.DataFrame, series: str, begin: pd.Timestamp, end: pd.Timestamp):
    """The source rows of one series with time in [begin, end), by a direct pandas slice."""
    mask = (table["id"] == series) & (table["time"] >= begin) & (table["time"] < end)
    return table[mask].sort_values("time")


# Regular grid


def test_grid_inserts_missing_timestamps_flags_them_and_keeps_every_row():
    table = make_table({"a": 20})
    gappy = table.drop(index=[3, 4, 10]).reset_index(drop=True)
    gappy.loc[gappy["time"] == table["time"][7], "y"] = np.nan
    spec = TableSpec(**SPEC)
    grid = to_regular_grid(validate_table(gappy, spec, 2, 2), spec, "y_missing")

    pd.testing.assert_index_equal(pd.DatetimeIndex(grid["time"]), pd.DatetimeIndex(table["time"]))
    assert grid["y_missing"].to_list() == [float(i in (3, 4, 7, 10)) for i in range(20)]
    kept = gappy.dropna(subset=["y"])
    merged = kept.merge(grid, on=["id", "time"], suffixes=("", "_grid"))
    assert len(merged) == len(kept)
    np.testing.assert_array_equal(merged["y"], merged["y_grid"])
    expected_fill = {3: 2, 4: 2, 7: 6, 10: 9}  # forward fill from the last observed step
    for row, source in expected_fill.items():
        assert grid["y"][row] == table["y"][source]
    assert (grid["size"] == 2.0).all()


def test_missing_target_windows_are_left_out_unless_asked():
    table = make_table({"a": 60})
    table.loc[30, "y"] = np.nan
    # The filled step is a repair of the user's table: announced, with its series.
    filled = (
        r"^filled 1 missing target steps \(forward fill, .*; flagged as missing to the model\) "
        r"in 1 of 1 series: 'a' 1; "
    )
    # Step 30 lies in the horizons of the 3 windows forecasting from steps 28, 29 and 30.
    left_out = (
        r"the 3 windows whose horizon holds one are left out \(prepare_dataset's "
        r"require_observed_target=False keeps the 3 of them with an observed step"
    )
    with pytest.warns(UserWarning, match=filled + left_out):
        strict = prepare(table, validation_fraction=0.0, test_fraction=0.0)
    horizons = strict.train.starts[:, None] + np.arange(3)
    assert not np.isin(30, horizons)
    assert strict.train.arrays()["target_mask"].min() == 1.0
    kept = (
        r"the 3 windows whose horizon holds one are kept, their 3 filled forecast steps masked "
        r"\(target_mask 0: left out of the loss and the scores\)"
    )
    with pytest.warns(UserWarning, match=filled + kept):
        loose = prepare(
            table, validation_fraction=0.0, test_fraction=0.0, require_observed_target=False
        )
    assert len(loose.train) == len(strict.train) + 3
    arrays = loose.train.arrays()
    assert (arrays["target_mask"] == 0).sum() == 3
    history_flags = arrays["historical"][:, :, -1]
    assert history_flags.sum() == 6  # the filled step sits in 6 windows' histories


@pytest.mark.parametrize("required", [True, False])
def test_missing_report_counts_only_windows_left_out_for_a_filled_target_not_strided_ones(required):
    # 60 hourly rows, history 6, horizon 3: starts at offsets 6..57 (52 windows);
    # the filled row 30 lies in the horizons of starts 28, 29 and 30.
    table = make_table({"a": 60})
    table.loc[30, "y"] = np.nan
    with pytest.warns(UserWarning, match="filled 1 missing target steps"):
        dataset = prepare(table, validation_fraction=0.0, test_fraction=0.0, train_stride=4,
                          require_observed_target=required)  # fmt: skip
    report = dataset.missing_report()
    eligible = 52 - 3 if required else 52
    assert report.loc[0, "windows"] == len(range(0, eligible, 4)) == len(dataset.train)
    assert report.loc[0, "windows_left_out"] == (3 if required else 0)


# Bad tables


def _with(column: str, row: int, value: object):
    def mutate(table: pd.DataFrame) -> pd.DataFrame:
        table = table.astype({column: object})
        table.loc[row, column] = value
        return table

    return mutate


BAD_TABLES = {
    "missing column": (lambda t: t.drop(columns="temp"), {}, r"lacks columns \['temp'\]"),
    "non-numeric target": (_with("y", 5, "abc"), {}, r"column 'y' .*non-numeric.*'abc'.*'a'"),
    "infinite value": (_with("temp", 5, np.inf), {}, r"column 'temp' .*infinite.*'a'"),
    "duplicate timestamp": (
        lambda t: pd.concat([t, t.iloc[[70]]], ignore_index=True),
        {},
        r"repeat a \('id', 'time'\) pair, e.g. series 'a'.*groupby",
    ),
    "unparseable time": (
        lambda t: t.assign(time=t["time"].astype(str)).pipe(_with("time", 9, "not a time")),
        {},
        r"column 'time' .*unparseable.*'not a time'.*'a'",
    ),
    "empty time": (_with("time", 9, None), {}, r"column 'time' has 1 empty.*'a'"),
    "every series short": (
        lambda t: t[t.index < 10],
        {},
        r"every series \(1\) is shorter than 12 steps .*'a' \(10 steps\)",
    ),
    "unknown frequency": (lambda t: t, {"freq": "xyz"}, r"unknown frequency freq='xyz'"),
    "off-grid timestamp": (
        lambda t: t.assign(time=t["time"].where(t.index != 4, t["time"][4] + pd.Timedelta("1min"))),
        {},
        r"series 'a' has 1 timestamps off the freq='h' grid",
    ),
    "varying static": (_with("size", 3, 9.0), {}, r"static column 'size' .*series 'a'"),
    "empty id": (_with("id", 3, None), {}, r"id column 'id' is empty at row 3"),
    "column in two roles": (lambda t: t, {"known_cols": ["temp"]}, r"'temp' .*more than one"),
    "reserved name": (
        lambda t: t.rename(columns={"promo": "time_index"}),
        {"known_cols": ["time_index"]},
        r"reserved",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_bad_table_is_rejected_with_a_message_naming_the_problem(case):
    mutate, options, message = BAD_TABLES[case]
    with pytest.raises(ValueError, match=message):
        prepare_dataset(
            mutate(make_table({"a": 80, "b": 40})),
            **{**SPEC, "history": 8, "horizon": 4, **options},
        )


def test_naive_times_with_a_timezone_are_rejected():
    table = make_table().assign(time=lambda t: t["time"].dt.tz_localize(None))
    with pytest.raises(ValueError, match="timezone='Australia/Melbourne' needs timezone-aware"):
        prepare(table, timezone="Australia/Melbourne")


def test_column_list_given_as_a_string_is_a_type_error():
    with pytest.raises(TypeError, match=r"static_cols must be a list.*\['size'\]"):
        TableSpec(id_col="id", time_col="time", target="y", static_cols="size")


# Calendar


def test_calendar_features_exact_values_for_known_timestamps():
    times = pd.DatetimeIndex(
        ["2021-03-15 06:00", "2021-03-15 06:30", "2020-12-31 18:00", "2021-01-01 00:00"]
    )
    features = calendar_features(times, "h")
    hours = np.array([6.0, 6.5, 18.0, 0.0]) / 24
    weekdays = np.array([0, 0, 3, 4]) / 7  # Monday, Monday, Thursday, Friday
    year_days = np.array([73 / 365, 73 / 365, 365 / 366, 0.0])  # 2020 is a leap year
    expected = np.stack(
        [f(2 * np.pi * p) for p in (hours, weekdays, year_days) for f in (np.sin, np.cos)],
        axis=1,
    )
    np.testing.assert_allclose(features, expected, atol=1e-12)
    assert calendar_feature_names("h") == (
        "hour_of_day_sin",
        "hour_of_day_cos",
        "day_of_week_sin",
        "day_of_week_cos",
        "day_of_year_sin",
        "day_of_year_cos",
    )
    np.testing.assert_allclose(features[0, :2], [1.0, 0.0], atol=1e-12)  # 06:00 = quarter day


def test_calendar_features_read_in_the_given_timezone():
    utc = pd.DatetimeIndex(["2014-12-31T13:00:00Z"])  # Melbourne: 2015-01-01 00:00, Thursday
    features = calendar_features(utc, "h", "Australia/Melbourne")
    np.testing.assert_allclose(features[0, :2], [0.0, 1.0], atol=1e-12)
    np.testing.assert_allclose(
        features[0, 2:4], [np.sin(2 * np.pi * 3 / 7), np.cos(2 * np.pi * 3 / 7)], atol=1e-12
    )
    np.testing.assert_allclose(features[0, 4:], [0.0, 1.0], atol=1e-12)


@pytest.mark.parametrize(
    ("freq", "cycles"),
    [("15min", 3), ("h", 3), ("D", 2), ("B", 2), ("W", 1), ("MS", 1), ("YS", 0)],
)
def test_calendar_cycles_are_only_those_the_frequency_resolves(freq, cycles):
    names = calendar_feature_names(freq)
    assert len(names) == 2 * cycles
    times = pd.date_range("2021-01-04", periods=5, freq=freq)
    assert calendar_features(times, freq).shape == (5, 2 * cycles)


def test_time_index_counts_steps_and_is_unit_over_training():
    dataset = prepare(make_table())
    frame = dataset.frame
    steps = (frame["time"] - frame["time"].min()) / STEP
    train_steps = (dataset.validation_start - frame["time"].min()) / STEP
    np.testing.assert_allclose(frame["time_index"], steps / train_steps, rtol=1e-6)


@pytest.mark.parametrize("freq", ["h", "D", "W", "MS", "B"])
def test_steps_before_the_origin_count_negative_for_every_frequency(freq):
    # A table reusing a fitted preprocessor may start before the training table;
    # calendar frequencies ('D', 'W', 'MS') counted all those times as step 0.
    times = pd.date_range("2021-01-04", periods=8, freq=freq)
    np.testing.assert_array_equal(steps_since(times, times[3], freq), np.arange(-3.0, 5.0))


@pytest.mark.parametrize("freq", ["D", "2D"])
def test_steps_of_local_days_across_daylight_saving_changes_are_whole(freq):
    # Berlin's days of 28 March (23 h) and 31 October (25 h): elapsed time over
    # 24 h read 3.958 steps for the fourth day after 25 March, not 4.
    times = pd.date_range("2021-03-21", "2021-11-06", freq=freq, tz="Europe/Berlin")
    expected = np.arange(len(times)) - 2.0
    np.testing.assert_array_equal(steps_since(times, times[2], freq), expected)
    in_utc = times.tz_convert("UTC")  # the same instants, read in the origin's zone
    np.testing.assert_array_equal(steps_since(in_utc, times[2], freq), expected)
    table = make_table({"a": len(times)}).assign(time=times)
    dataset = prepare(table, freq=freq, timezone="Europe/Berlin")
    time_index = dataset.frame["time_index"] * dataset.preprocessor.train_steps
    np.testing.assert_allclose(time_index, np.arange(len(times)), atol=1e-4)


def test_daily_table_prepares_with_daily_calendar():
    table = make_table({"a": 50, "b": 45})
    day = table.groupby("id").cumcount() * pd.Timedelta(days=1)
    table["time"] = pd.Timestamp("2021-01-01", tz="UTC") + day
    dataset = prepare(table, freq="D")
    assert dataset.known_feature_names == (*calendar_feature_names("D"), "time_index", "promo")
    np.testing.assert_allclose(
        dataset.frame["day_of_week_sin"][:7],
        np.sin(2 * np.pi * np.array([4, 5, 6, 0, 1, 2, 3]) / 7),  # 2021-01-01 was a Friday
        atol=1e-6,
    )


def berlin_midnights_in_utc(n: int = 70) -> pd.DataFrame:
    """`make_table`'s columns on `n` Berlin midnights across the March 2021 change, in UTC."""
    table = make_table({"a": n, "b": n})
    days = pd.date_range("2021-03-01", periods=n, freq="D", tz="Europe/Berlin")
    table["time"] = np.tile(days.tz_convert("UTC"), 2)  # 23:00, then 22:00 after 28 March
    return table


def test_aware_times_are_read_in_the_given_timezone_for_the_grid_and_calendar():
    # UTC instants of Berlin midnights are off every UTC daily grid once they
    # cross the daylight-saving change; read in timezone= they are on it.
    table = berlin_midnights_in_utc()
    dataset = prepare(table, freq="D", timezone="Europe/Berlin")
    times = dataset.frame["time"]
    assert str(times.dt.tz) == "Europe/Berlin"
    assert (times.dt.hour == 0).all() and len(dataset.frame) == len(table)
    local = pd.DatetimeIndex(table["time"]).tz_convert("Europe/Berlin")  # the same instants
    assert set(times) == set(local)
    weekday = np.asarray(local.day_of_week, dtype=float)  # table and frame: by (id, time)
    np.testing.assert_allclose(
        dataset.frame["day_of_week_sin"], np.sin(2 * np.pi * weekday / 7), atol=1e-6
    )
    assert weekday[27] == 6 and local[28].utcoffset() == pd.Timedelta(hours=2)  # 28 March, Sunday


def test_aware_times_off_the_grid_in_a_fixed_offset_say_to_convert_them():
    spec = TableSpec(**dict(SPEC, freq="D"))
    table = berlin_midnights_in_utc()
    # At predict there is no timezone= argument: the message says how to convert.
    with pytest.raises(
        ValueError,
        match=r"off the freq='D' grid .*they are given in UTC, of one UTC offset all year\) "
        r"\(zones where they fall at one clock time: 'Europe/Amsterdam', 'Europe/Andorra' or "
        r"'Europe/Belgrade'\).*when fitting, pass it as timezone= \(--timezone\), or convert "
        r"the column, e\.g\. df\['time'\] = df\['time'\]\.dt\.tz_convert\('Europe/Amsterdam'\)",
    ):
        validate_table(table, spec, 6, 3)
    converted = table.assign(time=table["time"].dt.tz_convert("Europe/Berlin"))
    assert len(validate_table(converted, spec, 6, 3)) == len(table)  # the fix works
    # Times already in a zone with daylight saving get no such hint.
    shift = pd.to_timedelta((table.index == 5).astype(int), unit="h")  # one time an hour off
    gappy = converted.assign(time=converted["time"] + shift)
    with pytest.raises(ValueError, match="off the freq='D' grid") as error:
        validate_table(gappy, spec, 6, 3)
    assert "tz_convert" not in str(error.value)


# Scaling


def test_target_scaler_is_fitted_on_observed_training_targets_only():
    table = make_table()
    dataset = prepare(table)
    train = table[table["time"] < dataset.validation_start]
    stats = train.groupby("id")["y"].agg(["mean", "std"])
    np.testing.assert_allclose(dataset.target_scaler.loc, stats["mean"].to_numpy())
    n = train.groupby("id")["y"].size().to_numpy()
    np.testing.assert_allclose(
        dataset.target_scaler.scale, stats["std"].to_numpy() * np.sqrt((n - 1) / n)
    )


def test_changing_later_targets_changes_neither_scaler_nor_training_windows():
    table = make_table()
    dataset = prepare(table)
    changed = table.copy()
    later = changed["time"] >= dataset.validation_start
    changed.loc[later, ["y", "temp", "promo"]] = changed.loc[later, ["y", "temp", "promo"]] * 50 + 7
    other = prepare(changed)
    np.testing.assert_array_equal(dataset.target_scaler.loc, other.target_scaler.loc)
    np.testing.assert_array_equal(dataset.target_scaler.scale, other.target_scaler.scale)
    np.testing.assert_array_equal(dataset.feature_scaler.loc, other.feature_scaler.loc)
    for key, value in dataset.train.arrays().items():
        np.testing.assert_array_equal(value, other.train.arrays()[key])
    assert not np.array_equal(dataset.test.arrays()["target"], other.test.arrays()["target"])


@pytest.mark.parametrize("method", ["standard", "robust", "mean_abs", "none"])
def test_inverse_transform_round_trips_forecast_shaped_arrays(method):
    dataset = prepare(make_table(), scaler=method)
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 2, 7)
    values = rng.normal(0, 100, (7, 3, 5))
    scaler = dataset.target_scaler
    np.testing.assert_allclose(
        dataset.inverse_transform(scaler.transform(values, codes), codes), values, rtol=1e-12
    )
    expected = values * scaler.scale[codes][:, None, None] + scaler.loc[codes][:, None, None]
    np.testing.assert_allclose(dataset.inverse_transform(values, codes), expected)


def test_robust_scale_of_an_intermittent_series_is_its_mean_absolute_deviation_with_a_warning():
    # Series 0: 85% zeros and spikes of 5000 (interquartile range 0); series 1: ordinary.
    spikes = np.where(np.arange(40) % 7 == 0, 5000.0, 0.0)
    ordinary = np.linspace(10.0, 20.0, 40)
    values = np.concatenate([spikes, ordinary])
    codes = np.repeat([0, 1], 40)
    with pytest.warns(UserWarning, match=r"1 series have an interquartile range of 0.*'shop'"):
        scaler = TargetScaler.fit(values, codes, 2, "robust", series_names=["shop", "mall"])
    median = np.median(spikes)
    assert scaler.loc[0] == median == 0.0
    assert scaler.scale[0] == pytest.approx(np.mean(np.abs(spikes - median)))
    q25, q75 = np.percentile(ordinary, [25, 75])
    assert scaler.scale[1] == pytest.approx(q75 - q25)
    # A constant series is no intermittent one: scaled by its level, announced as constant.
    with pytest.warns(UserWarning, match=r"1 series are constant .*: 0;"):
        constant = TargetScaler.fit(np.full(10, 3.0), np.zeros(10, int), 1, "robust")
    assert (constant.loc[0], constant.scale[0]) == (3.0, 3.0)


@pytest.mark.parametrize("method", ["standard", "robust", "mean_abs"])
def test_a_series_of_small_magnitude_keeps_its_own_scale(method):
    # Values around 1e-9 vary (they are no constant): a scale of 1 would leave
    # them ~0 in model units, and forecasts mapped back ~1e7 times too large.
    values = 1e-9 * (1.0 + np.random.default_rng(0).random(50))
    scaler = TargetScaler.fit(values, np.zeros(50, int), 1, method)
    scaled = scaler.transform(values, np.zeros(50, int))
    assert 0.1 < np.abs(scaled).max() < 10.0, (scaler.loc, scaler.scale)
    features = FeatureScaler.fit(values[:, None])
    assert features.scale[0] == pytest.approx(np.std(values))
    if method != "mean_abs":  # a constant at that magnitude is centred, scaled by its level
        with pytest.warns(UserWarning, match=r"constant"):
            constant = TargetScaler.fit(np.full(10, 3e-9), np.zeros(10, int), 1, method)
        assert (constant.loc[0], constant.scale[0]) == pytest.approx((3e-9, 3e-9), rel=1e-12)


@pytest.mark.parametrize("method", ["standard", "robust"])
def test_a_series_varying_little_against_its_level_keeps_its_own_scale(method):
    # A meter reading around 4.2e9 varying by ~31: a spread of 7e-9 of the level,
    # called constant under a 1e-8 threshold and fed to the model as +-31.
    values = 4.2e9 + 31.0 * np.random.default_rng(1).standard_normal(200)
    codes = np.zeros(200, int)
    scaler = TargetScaler.fit(values, codes, 1, method)
    scaled = scaler.transform(values, codes)
    assert 0.5 < np.std(scaled) < 2.0, (scaler.loc, scaler.scale)
    features = FeatureScaler.fit(values[:, None])
    assert features.scale[0] == pytest.approx(np.std(values), rel=1e-9)
    # Identical values whose float64 statistics round (mean of 0.1 thrice) stay constant.
    with pytest.warns(UserWarning, match=r"constant"):
        constant = TargetScaler.fit(np.full(3, 0.1), np.zeros(3, int), 1, method)
    assert constant.scale[0] == pytest.approx(0.1, rel=1e-12)


@pytest.mark.parametrize("method", ["standard", "robust"])
def test_a_constant_series_is_scaled_by_its_level_and_named_in_a_warning(method):
    # A scale of 1 in the target's units put the forecast band of a series constant at
    # 3e-9 some 1e7 times its level wide. Seven constants (levels, then 0) and one varying.
    levels = [3e-9, -2e6, 0.0, 5.0, 6.0, 7.0, 8.0]
    varying = np.linspace(1.0, 3.0, 12)
    values = np.concatenate([np.full(12, level) for level in levels] + [varying])
    codes = np.repeat(np.arange(8), 12)
    names = [f"s{k}" for k in range(8)]
    with pytest.warns(UserWarning) as caught:
        scaler = TargetScaler.fit(values, codes, 8, method, series_names=names)
    (message,) = [str(w.message) for w in caught if "constant" in str(w.message)]
    assert message.startswith("7 series are constant in the training period: 's0', 's1', "
                              "'s2', 's3', 's4' and 2 more;")  # fmt: skip
    np.testing.assert_array_equal(scaler.loc[:7], levels)
    np.testing.assert_allclose(scaler.scale[:7], [3e-9, 2e6, 1.0, 5.0, 6.0, 7.0, 8.0])
    q25, q75 = np.percentile(varying, [25, 75])
    spread = np.std(varying) if method == "standard" else q75 - q25
    assert scaler.scale[7] == pytest.approx(spread, rel=1e-12)


def test_a_constant_tiny_series_forecast_band_is_relative_to_its_level():
    # Window normalization floors a window's scale at WINDOW_SCALE_FLOOR per-series units:
    # times the series' scale, that is a share of the level, not 0.05 in the target's units.
    times = pd.date_range("2024-01-01", periods=40, freq="D")
    table = pd.concat(
        [
            pd.DataFrame({"id": "tiny", "time": times, "y": 3e-9}),
            pd.DataFrame({"id": "other", "time": times, "y": np.sin(np.arange(40.0))}),
        ],
        ignore_index=True,
    )
    with pytest.warns(UserWarning, match=r"1 series are constant in the training period: 'tiny'"):
        dataset = prepare_dataset(
            table, id_col="id", time_col="time", target="y", freq="D", history=4, horizon=2,
            window_normalization=True,
        )  # fmt: skip
    windows = dataset.test
    rows = np.flatnonzero(
        windows.panel.series_code[windows.starts] == dataset.series_ids.index("tiny")
    )
    codes = windows.panel.series_code[windows.starts[rows]]
    one_unit = windows.denormalize(np.ones((len(rows), 2)), rows)  # a model output of +1
    forecast = dataset.target_scaler.inverse_transform(one_unit, codes)
    np.testing.assert_allclose(forecast, 3e-9 * (1.0 + WINDOW_SCALE_FLOOR), rtol=1e-9)


@pytest.mark.parametrize("method", ["standard", "robust", "mean_abs"])
def test_a_series_of_huge_magnitude_keeps_its_own_scale(method):
    # np.std of values around 1e200 overflows (their squares are beyond float64):
    # the scale fell back to 1, leaving scaled targets ~1e200. The scale of x is
    # 1e200 times the scale of x / 1e200 (an independent float64 reference).
    unit = 1.0 + np.random.default_rng(0).random(50)
    values = 1e200 * unit
    codes = np.zeros(50, int)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow RuntimeWarning either
        scaler = TargetScaler.fit(values, codes, 1, method)
    reference = TargetScaler.fit(unit, codes, 1, method)
    np.testing.assert_allclose(scaler.loc, 1e200 * reference.loc, rtol=1e-12)
    np.testing.assert_allclose(scaler.scale, 1e200 * reference.scale, rtol=1e-12)
    assert 0.1 < np.abs(scaler.transform(values, codes)).max() < 10.0
    if method == "standard":
        np.testing.assert_allclose(FeatureScaler.fit(values[:, None]).scale, 1e200 * np.std(unit))


def test_inverse_transform_rejects_mismatched_codes():
    dataset = prepare(make_table())
    with pytest.raises(ValueError, match=r"series_code must have shape \(4,\)"):
        dataset.inverse_transform(np.zeros((4, 3, 2)), np.zeros(3, dtype=int))
    with pytest.raises(ValueError, match=r"lie in \[0, 2\)"):
        dataset.inverse_transform(np.zeros((2, 3)), np.array([0, 2]))


# Windows


@pytest.mark.parametrize("split", ["train", "validation", "test"])
def test_window_contents_equal_the_source_rows(split):
    table = make_table()
    history, horizon = 6, 3
    dataset = prepare(table)
    windows = dataset.split(split)
    arrays = windows.arrays()
    train = table[table["time"] < dataset.validation_start]
    temp_mean, temp_std = train["temp"].mean(), train["temp"].std(ddof=0)
    promo_mean, promo_std = train["promo"].mean(), train["promo"].std(ddof=0)
    sizes = train.groupby("id")["size"].first()  # one value per training series
    size_mean, size_std = sizes.mean(), sizes.std(ddof=0)
    assert len(windows) > 0
    for i, start in enumerate(windows.forecast_start):
        series = dataset.series_ids[arrays["series_code"][i]]
        past = rows_of(table, series, start - history * STEP, start)
        ahead = rows_of(table, series, start, start + horizon * STEP)
        assert len(past) == history and len(ahead) == horizon
        code = np.array([arrays["series_code"][i]])
        np.testing.assert_allclose(
            dataset.inverse_transform(arrays["target"][i : i + 1], code)[0], ahead["y"], rtol=1e-5
        )
        np.testing.assert_allclose(
            dataset.inverse_transform(arrays["historical"][i : i + 1, :, 0], code)[0],
            past["y"],
            rtol=1e-5,
        )
        np.testing.assert_allclose(
            arrays["historical"][i, :, 1], (past["temp"] - temp_mean) / temp_std, atol=1e-5
        )
        assert arrays["historical"].shape[-1] == 2  # no target is missing: no missing flag
        np.testing.assert_allclose(
            arrays["future"][i, :, -1], (ahead["promo"] - promo_mean) / promo_std, atol=1e-5
        )
        np.testing.assert_allclose(
            arrays["known_history"][i, :, :6], calendar_features(past["time"], "h"), atol=1e-6
        )
        np.testing.assert_allclose(
            arrays["future"][i, :, :6], calendar_features(ahead["time"], "h"), atol=1e-6
        )
        assert arrays["static"][i, 0] == pytest.approx(
            (past["size"].iloc[0] - size_mean) / size_std, abs=1e-6
        )
        assert arrays["static_categorical"][i, 0] == arrays["series_code"][i]
        pd.testing.assert_index_equal(windows.forecast_times(i), pd.DatetimeIndex(ahead["time"]))


def test_window_arrays_have_the_model_shapes_and_dtypes():
    dataset = prepare(make_table())
    arrays = dataset.train.take(np.arange(4))
    expected = {
        "static": ((4, 1), np.float32),
        "static_categorical": ((4, 1), np.int32),
        "historical": ((4, 6, 2), np.float32),  # target, temp (no missing flag: none missing)
        "known_history": ((4, 6, 8), np.float32),
        "future": ((4, 3, 8), np.float32),
        "target": ((4, 3), np.float32),
        "series_code": ((4,), np.int32),
    }
    for key, (shape, dtype) in expected.items():
        assert arrays[key].shape == shape and arrays[key].dtype == dtype, key
    config = dataset.tft_config_kwargs()
    assert config["num_observed_features"] == 2 and config["num_known_features"] == 8
    assert config["static_categorical_cardinalities"] == (3,)  # two series + unknown
    assert dataset.observed_feature_names == ("y", "temp")  # the flag would be all zeros
    assert dataset.static_weight_names == ("size", "id")


def test_every_window_of_a_gapless_table_is_in_exactly_one_split_or_straddles_a_cut():
    table = make_table()
    dataset = prepare(table)
    counted = sum(len(dataset.split(name)) for name in ("train", "validation", "test"))
    per_series = table.groupby("id").size().to_numpy() - 6 - 3 + 1
    cuts = [dataset.validation_start, dataset.test_start]
    straddling = 0
    for _, group in table.groupby("id"):
        times = group["time"].sort_values().to_numpy()
        for start in range(6, len(times) - 3 + 1):
            first, last = times[start], times[start + 2]
            straddling += sum(first < cut <= last for cut in cuts)
    assert counted + straddling == per_series.sum()


def test_csv_path_gives_the_same_windows_as_the_dataframe(tmp_path):
    table = make_table()
    path = tmp_path / "table.csv"
    table.assign(time=table["time"].dt.strftime("%Y-%m-%dT%H:%M:%SZ")).to_csv(path, index=False)
    from_frame, from_csv = prepare(table), prepare(str(path))
    for key, value in from_frame.validation.arrays().items():
        np.testing.assert_array_equal(value, from_csv.validation.arrays()[key])


# Split


@given(
    history=st.integers(1, 8),
    horizon=st.integers(1, 5),
    validation_fraction=st.sampled_from([0.1, 0.2, 0.3]),
    test_fraction=st.sampled_from([0.1, 0.2]),
    stride=st.integers(1, 3),
)
def test_split_has_no_leakage(history, horizon, validation_fraction, test_fraction, stride):
    dataset = prepare(
        make_table({"a": 90, "b": 70, "c": 60}),
        history=history,
        horizon=horizon,
        validation_fraction=validation_fraction,
        test_fraction=test_fraction,
        train_stride=stride,
        eval_stride=stride,
    )
    times = {
        name: dataset.panel.times[(windows.starts[:, None] + np.arange(horizon)).ravel()]
        for name in ("train", "validation", "test")
        for windows in [dataset.split(name)]
    }
    assert all(len(value) for value in times.values())
    assert times["train"].max() < dataset.validation_start <= times["validation"].min()
    assert times["validation"].max() < dataset.test_start <= times["test"].min()
    panel = dataset.panel
    train_history = panel.times[(dataset.train.starts[:, None] + np.arange(-history, 0)).ravel()]
    assert train_history.max() < dataset.validation_start
    assert np.all(
        panel.series_code[dataset.train.starts[:, None] + np.arange(-history, horizon)]
        == dataset.train.series_code[:, None]
    )


def test_explicit_cut_times_are_respected():
    table = make_table()
    dataset = prepare(table, validation_start="2021-03-03 12:00", test_start="2021-03-04")
    assert dataset.validation_start == pd.Timestamp("2021-03-03 12:00", tz="UTC")
    assert dataset.validation.forecast_start.min() >= dataset.validation_start
    last_train = dataset.train.forecast_start.max() + 2 * STEP
    assert last_train == dataset.validation_start - STEP
    with pytest.raises(ValueError, match=r"validation_start .*<= test_start"):
        prepare(table, validation_start="2021-03-04", test_start="2021-03-03")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"freq": "2h"}, r"freq='2h' \(the preprocessor's: 'h'\)"),
        ({"target": "temp", "observed_cols": ["y"]}, r"target='temp' \(the preprocessor's: 'y'\)"),
        ({"timezone": "Europe/Berlin"}, r"timezone='Europe/Berlin' \(the preprocessor's: None\)"),
    ],
)
def test_a_spec_other_than_the_preprocessors_is_refused_by_field(options, message):
    # The preprocessor's spec was used instead, silently: another freq moved the
    # split cuts, another target failed deep with a KeyError.
    table = make_table()
    fitted = prepare(table).preprocessor
    with pytest.raises(ValueError, match=rf"fitted with another table spec: {message}"):
        prepare(table, preprocessor=fitted, **options)
    same = prepare(table, preprocessor=fitted, freq="60min")  # the same frequency
    assert same.spec.freq == "h"


def test_a_target_scaling_other_than_the_preprocessors_is_refused_by_name():
    # Ignored before: targets were scaled as the preprocessor was fitted, not as asked.
    table = make_table()
    fitted = prepare(table, scaler="robust", target_transform="log1p").preprocessor
    for options, message in (
        ({"target_transform": "none"}, r"target_transform='none' \(the preprocessor's: 'log1p'\)"),
        ({"scaler": "standard"}, r"scaler='standard' \(the preprocessor's: 'robust'\)"),
    ):
        with pytest.raises(ValueError, match=rf"another target scaling: {message}"):
            prepare(table, preprocessor=fitted, **options)
    # Left out, or given as fitted, they are the preprocessor's.
    for options in ({}, {"scaler": "robust", "target_transform": "log1p"}):
        again = prepare(table, preprocessor=fitted, **options)
        assert again.target_scaler.target_transform == "log1p"
        assert again.target_scaler.method == "robust"
    assert prepare(table).target_scaler.method == "standard"  # the default without one


def test_split_fractions_take_numpy_floats_and_refuse_non_numbers_by_name():
    table = make_table()
    plain = prepare(table, validation_fraction=0.25, test_fraction=0.125)
    # np.float32(0.25) was refused as "must be a number" (it is one, and exact).
    numpy = prepare(table, validation_fraction=np.float32(0.25), test_fraction=np.float64(0.125))
    assert (numpy.validation_start, numpy.test_start) == (plain.validation_start, plain.test_start)
    for value, error in (
        ("0.1", TypeError),
        (True, TypeError),
        (1.0, ValueError),
        (np.nan, ValueError),
    ):
        with pytest.raises(error, match=r"validation_fraction must be a number in \[0, 1\)"):
            prepare(table, validation_fraction=value)


BERLIN_CUTS = dict(timezone="Europe/Berlin", validation_start="2021-03-05", test_start="2021-03-06")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"train_stride": 0}, ValueError, r"^train_stride must be an int >= 1, got 0"),
        ({"eval_stride": 2.0}, ValueError, r"^eval_stride must be an int >= 1, got 2.0"),
        ({"min_series_length": "100"}, ValueError, r"^min_series_length must be None or an int"),
        ({"window_normalization": "false"}, TypeError, r"^window_normalization must be a bool"),
        ({"require_observed_target": "no"}, TypeError, r"^require_observed_target must be a bool"),
        (  # 02:30 on 28 March 2021 does not exist in Berlin
            {**BERLIN_CUTS, "test_start": "2021-03-28 02:30"},
            ValueError,
            r"^test_start='2021-03-28 02:30' is no single time in Europe/Berlin",
        ),
    ],
)
def test_bad_prepare_options_are_refused_naming_the_option(options, error, message):
    # 'false' read as True and the stride messages named no option ("stride must ...").
    table = make_table({"a": 24 * 40})
    with pytest.raises(error, match=message):
        prepare(table, **options)


def test_a_split_without_windows_is_an_error():
    with pytest.raises(ValueError, match=r"the test period .* holds no complete window"):
        prepare(make_table(), test_fraction=0.01)


# Batches


def test_batches_cover_every_window_once_in_a_seeded_order():
    dataset = prepare(make_table())
    n = len(dataset.train)
    first = [b["index"] for b in dataset.train.batches(16, seed=3)]
    again = [b["index"] for b in dataset.train.batches(16, seed=3)]
    other = [b["index"] for b in dataset.train.batches(16, seed=4)]
    np.testing.assert_array_equal(np.sort(np.concatenate(first)), np.arange(n))
    np.testing.assert_array_equal(np.concatenate(first), np.concatenate(again))
    assert not np.array_equal(np.concatenate(first), np.concatenate(other))
    assert [len(b) for b in first[:-1]] == [16] * (len(first) - 1)


def test_drop_last_skips_only_the_short_final_batch():
    sizes = [len(b) for b in batch_indices(10, 4, drop_last=True)]
    assert sizes == [4, 4]
    assert [len(b) for b in batch_indices(10, 4, shuffle=False)] == [4, 4, 2]
    np.testing.assert_array_equal(next(batch_indices(10, 4, shuffle=False)), [0, 1, 2, 3])


# Bundled data and module boundaries


@pytest.fixture(scope="module")
def pedestrian():
    # The table's 3,011 missing hours (`tft_jax.data.pedestrian`'s docstring) are announced.
    filled = (
        r"^filled 3011 missing target steps \(forward fill, .*\) in 4 of 4 series: "
        r"'Birrarung Marr' 2978, 'Bourke Street Mall \(North\)' 2, "
        r"'QV Market-Elizabeth St \(West\)' 26, 'Southern Cross Station' 5; "
        r"the \d+ windows whose horizon holds one are left out"
    )
    with pytest.warns(UserWarning, match=filled):
        return prepare_pedestrian(history=24, horizon=6)


def test_pedestrian_table_has_four_hourly_sensors():
    table = load_pedestrian()
    assert list(table.columns) == ["Sensor", "Date_Time", "Date", "Time", "Count"]
    assert len(table) == 66037
    assert table["Sensor"].nunique() == 4


def test_pedestrian_windows_have_the_documented_shapes(pedestrian):
    arrays = pedestrian.test.take(np.arange(8))
    assert arrays["static"].shape == (8, 0)
    assert arrays["historical"].shape == (8, 24, 2)
    assert arrays["known_history"].shape == (8, 24, 7)
    assert arrays["future"].shape == (8, 6, 7)
    assert arrays["target"].shape == (8, 6)
    assert pedestrian.static_categorical_cardinalities == (5,)  # four sensors + unknown
    summary = pedestrian.summary()
    assert summary["rows"] == 66037 + 3011
    assert sorted(summary["filled_target_steps"].values()) == [2, 5, 26, 2978]
    assert min(summary["windows"].values()) > 1000


def test_pedestrian_hour_of_day_is_the_local_time_column(pedestrian):
    table = load_pedestrian()
    frame = pedestrian.frame.dropna(subset=["Count"])
    merged = frame.merge(
        table.assign(Date_Time=pd.to_datetime(table["Date_Time"])), on=["Sensor", "Date_Time"]
    )
    angle = 2 * np.pi * merged["Time"] / 24
    np.testing.assert_allclose(merged["hour_of_day_sin"], np.sin(angle), atol=1e-6)
    np.testing.assert_allclose(merged["hour_of_day_cos"], np.cos(angle), atol=1e-6)


def test_data_package_imports_neither_the_model_nor_jax():
    forbidden = ("jax", "flax", "optax", "qat", "tft_jax.model", "tft_jax.train")
    package = pathlib.Path(__file__).resolve().parent.parent / "tft_jax" / "data"
    # Which line a warning names: plain Python, shared by every package of ours.
    shared = package.parent / "caller_frame.py"
    for path in (*package.glob("*.py"), shared):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.startswith(("tft_jax.data", "tft_jax.caller_frame")) or not (
                    name.startswith((*forbidden, "tft_jax"))
                ), f"{path.name} imports {name}"


def test_a_series_starting_after_the_validation_start_is_left_out_with_a_warning():
    # A store opened after the cut has no target to fit its scaler on: the whole fit
    # failed. It is left out as a short series is: the rest prepares as without it.
    times = pd.date_range("2024-01-01", periods=60, freq="D")
    rng = np.random.default_rng(0)
    table = pd.concat(
        [pd.DataFrame({"id": s, "time": times, "y": rng.normal(10, 1, 60)}) for s in "abn"],
        ignore_index=True,
    )
    table = table[~((table["id"] == "n") & (table["time"] < "2024-02-10"))]
    options = dict(id_col="id", time_col="time", target="y", freq="D", history=8, horizon=3,
                   validation_start="2024-02-05", test_start="2024-02-20")  # fmt: skip
    with pytest.warns(UserWarning, match=r"^left out 1 of 3 series with no observed target "
                      r"before validation_start 2024-02-05 00:00:00 .*: 'n';"):  # fmt: skip
        dataset = prepare_dataset(table, **options)
    without = prepare_dataset(table[table["id"] != "n"], **options)
    assert dataset.series_ids == without.series_ids == ("a", "b")
    for name in ("train", "validation", "test"):
        np.testing.assert_array_equal(getattr(dataset, name).arrays()["historical"],
                                      getattr(without, name).arrays()["historical"])  # fmt: skip
    np.testing.assert_array_equal(dataset.target_scaler.scale, without.target_scaler.scale)


def test_the_training_windows_digest_follows_the_values_they_read_not_the_panel_rows():
    cuts = {"validation_start": "2021-03-03 00:00", "test_start": "2021-03-03 12:00"}
    table = make_table()
    digest = prepare(table, **cuts).train.digest()
    assert len(digest) == 64 and prepare(make_table(), **cuts).train.digest() == digest
    a_rows = table.index[table["id"] == "a"]
    # A value no training window reads (series a, after the test cut): the same digest.
    later = table.copy()
    later.loc[a_rows[-1], "temp"] += 1.0
    assert prepare(later, **cuts).train.digest() == digest
    # Series a grown past the test cut: series b's rows move in the panel, its windows do not.
    extra = table.loc[a_rows[-10:]].assign(time=lambda rows: rows["time"] + 10 * STEP)
    grown = pd.concat([table.loc[a_rows], extra, table[table["id"] == "b"]], ignore_index=True)
    assert prepare(grown, **cuts).train.digest() == digest
    # One input value inside a training window: another digest.
    changed = table.copy()
    changed.loc[a_rows[10], "temp"] += 1.0
    assert prepare(changed, **cuts).train.digest() != digest


def test_take_refuses_window_numbers_numpy_would_repair_or_reject_in_its_own_words():
    # Before: 1.9 was window 1, -1 the last window, and past the end NumPy's IndexError.
    windows = prepare(make_table()).train
    count = len(windows)
    np.testing.assert_array_equal(windows.take(np.array([count - 1]))["index"], [count - 1])
    with pytest.raises(TypeError, match=r"take: indices must be a 1-D array of integer .* float64"):
        windows.take(np.array([1.9]))
    with pytest.raises(TypeError, match=r"take: indices must be a 1-D array .* shape \(\)"):
        windows.take(np.int64(3))
    with pytest.raises(ValueError, match=rf"in \[0, {count}\) .* got \[-1\]"):
        windows.take(np.array([0, -1]))
    with pytest.raises(ValueError, match=rf"in \[0, {count}\) .* got \[{count}\]"):
        windows.take(np.array([count]))


def test_batch_indices_refuses_a_negative_or_non_integer_count():
    with pytest.raises(ValueError, match=r"num_items must be >= 0, got -3"):
        list(batch_indices(-3, 2))
    with pytest.raises(TypeError, match=r"num_items must be an int, got 2.5"):
        list(batch_indices(2.5, 2))
    assert [batch.tolist() for batch in batch_indices(5, 2, shuffle=False)] == [[0, 1], [2, 3], [4]]


def _first_time_at_or_after(times, moment, end):
    """The first of `times` at or after `moment`, else `end`: a scan, no searchsorted."""
    later = [t for t in sorted(set(times)) if t >= moment]
    return later[0] if later else end


@pytest.mark.parametrize(("validation", "test"), [(0.2, 0.1), (0.3, 0.3), (0.25, 0.0)])
def test_split_times_snap_each_cut_to_the_first_time_at_or_after_its_fraction(validation, test):
    # Ten days and the end a day after the last: fractions of 0.1 land exactly on days.
    times = pd.date_range("2024-01-01", periods=10, freq="D")
    end = times[-1] + pd.Timedelta(days=1)
    span = end - times[0]
    expected = tuple(
        _first_time_at_or_after(times, times[0] + span * fraction, end)
        for fraction in (1.0 - validation - test, 1.0 - test)
    )
    assert split_times(times, end, validation, test) == expected


@pytest.mark.parametrize(("validation", "test"), [(0.5, 0.5), (0.75, 0.25), (1.0, 0.0)])
def test_split_times_refuse_fractions_that_leave_no_training_span(validation, test):
    times = pd.date_range("2024-01-01", periods=10, freq="D")
    with pytest.raises(ValueError, match=r"must be < 1|in \[0, 1\)"):
        split_times(times, times[-1] + pd.Timedelta(days=1), validation, test)
