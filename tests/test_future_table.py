"""`tft_jax.data.future`: the future table of known inputs and the history a fitted model
forecasts from. Bad tables are refused naming the series, time and column, and the fix a
fitted model allows; unseen categories are coded unknown and announced."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset
from tft_jax.data.future import future_windows

from .prepared_tables import HISTORY, HORIZON, forecast_inputs, prepare, quiet_prepare


def history_table(length: int = 40, start: str = "2021-03-01") -> pd.DataFrame:
    rng = np.random.default_rng(0)
    times = pd.date_range(start, periods=length, freq="h")
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "id": series,
                    "time": times,
                    "y": 10.0 + rng.normal(size=length),
                    "promo": rng.random(length),
                    "holiday": rng.choice(["none", "xmas"], length),
                }
            )
            for series in (1, 2)
        ],
        ignore_index=True,
    )


@pytest.fixture(scope="module")
def preprocessor():
    data = quiet_prepare(
        history_table(), freq="h", history=HISTORY, horizon=HORIZON,
        known_cols=["promo", "holiday"],
    )  # fmt: skip
    return data.preprocessor


def future_of(history: pd.DataFrame) -> pd.DataFrame:
    last = history.groupby("id")["time"].max()
    rows = [
        (series, time, 0.5, "none")
        for series, end in last.items()
        for time in pd.date_range(end, periods=HORIZON + 1, freq="h")[1:]
    ]
    return pd.DataFrame(rows, columns=["id", "time", "promo", "holiday"])


def test_a_future_time_off_the_grid_is_named_with_the_step_it_misses(preprocessor):
    history = history_table(12, "2021-04-01")
    future = future_of(history)
    future.loc[0, "time"] += pd.Timedelta(minutes=30)
    with pytest.raises(ValueError) as caught:
        forecast_inputs(preprocessor, history, future)
    message = str(caught.value)
    assert "no row for series 1 at 2021-04-01 12:00:00" in message
    assert "1 rows outside the forecast steps, e.g. series 1 at 2021-04-01 12:30:00" in message


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda f: f.assign(time=f["time"] + pd.Timedelta(hours=1)),
         r"no row for series 1 at 2021-04-01 12:00:00 \(2 missing\).*2 rows outside"),
        (lambda f: f.drop(index=[1]), r"no row for series 1 at 2021-04-01 13:00:00 \(1 missing\)"),
        (lambda f: f.assign(promo=f["promo"].mask(f.index == 2)),
         r"future column 'promo' is empty for series 2 at 2021-04-01 12:00:00"),
        (lambda f: f.assign(promo=f["promo"].astype(object).mask(f.index == 0, "lots")),
         r"'lots' in series 1 at row 0"),
        (lambda f: pd.concat([f, f.iloc[[1]]]), r"future repeats series 1 at 2021-04-01 13:00"),
        (lambda f: f.drop(columns=["holiday"]), r"future lacks the columns \['holiday'\]"),
        (lambda f: f.assign(id=f["id"].astype(str)), r"'1' \(str\) is 1 \(int\) in the history"),
        # Read as counts of the dtype's unit (1.6e15 microseconds) before, silently.
        (lambda f: f.assign(promo=f["time"].astype("datetime64[us]")),
         r"future table: column 'promo' holds datetimes \(dtype datetime64\[us\]\), not numbers"),
        (lambda f: f.assign(promo=pd.to_timedelta(f["promo"], unit="D")),
         r"column 'promo' holds time spans \(dtype timedelta64\[ns\]\)"),
    ],
)  # fmt: skip
def test_a_bad_future_table_is_refused_naming_series_time_and_column(preprocessor, edit, message):
    history = history_table(12, "2021-04-01")
    with pytest.raises(ValueError, match=message):
        forecast_inputs(preprocessor, history, edit(future_of(history)))


def test_future_values_of_the_target_or_an_observed_column_are_announced_as_unused(
    preprocessor,
):
    # Before: a future 'y' (or an observed column's values) was dropped without a word,
    # though a user may have meant the forecast to read it.
    history = history_table(12, "2021-04-01")
    future = future_of(history)
    plain, plain_said = forecast_inputs(preprocessor, history, future)
    with_target, said = forecast_inputs(preprocessor, history, future.assign(y=99.0, extra=1))
    # An empty target column (a table's future rows, not yet observed) has nothing unused.
    _, empty_said = forecast_inputs(preprocessor, history, future.assign(y=np.nan))
    assert not [text for text in empty_said if "future holds" in text]
    assert not [text for text in plain_said if "future holds" in text]
    assert [text for text in said if "future holds" in text] == [
        "future holds the columns ['y'], which the model reads from the history only (the "
        "target and observed columns are not known ahead): their future values are not used; "
        "and the columns ['extra'], which the model does not read (it reads only ['id', "
        "'time', 'promo', 'holiday'] of this table): they are not used"
    ]
    for name, values in plain.windows.arrays().items():
        np.testing.assert_array_equal(values, with_target.windows.arrays()[name], err_msg=name)


def test_future_columns_the_model_does_not_read_are_named_as_unused(preprocessor):
    # Before: a future column that is no column of the model ('discount', meant as a known
    # input the run was not trained with) was dropped without a word.
    history = history_table(12, "2021-04-01")
    future = future_of(history)
    plain, _ = forecast_inputs(preprocessor, history, future)
    given, said = forecast_inputs(preprocessor, history, future.assign(discount=0.2, note=np.nan))
    assert [text for text in said if "future holds" in text] == [
        "future holds the columns ['discount'], which the model does not read (it reads "
        "only ['id', 'time', 'promo', 'holiday'] of this table): they are not used"
    ]
    for name, values in plain.windows.arrays().items():
        np.testing.assert_array_equal(values, given.windows.arrays()[name], err_msg=name)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (["id", "time"],
         "future adds nothing: the model uses no known columns, so the forecast reads the "
         "history only; leave it out"),
        (["id", "time", "promo"],
         "future holds the columns ['promo'], which the model does not read: they are not "
         "used; the model uses no known columns, so the forecast reads the history only: "
         "the table adds nothing, leave it out"),
    ],
)  # fmt: skip
def test_a_future_for_a_model_with_no_known_columns_is_announced_as_adding_nothing(
    columns, message
):
    # Before: the whole future table was ignored silently (its 'promo' included).
    history = history_table(12, "2021-04-01")
    fitted = quiet_prepare(
        history_table()[["id", "time", "y"]], freq="h", history=HISTORY, horizon=HORIZON
    ).preprocessor
    _, said = forecast_inputs(fitted, history[["id", "time", "y"]], future_of(history)[columns])
    assert [text for text in said if text.startswith("future")] == [message]


def test_an_unseen_future_category_is_coded_unknown_and_announced(preprocessor):
    history = history_table(12, "2021-04-01")
    future = future_of(history)
    future.loc[future["id"] == 2, "holiday"] = "easter"
    future["extra"] = 1.0  # columns the model does not read are left aside
    ahead, messages = forecast_inputs(preprocessor, history, future)
    assert any("'holiday'" in m and "['easter']" in m for m in messages)
    codes = ahead.windows.take(np.arange(2))["future_categorical"][:, :, 0]
    unknown = len(preprocessor.vocabularies["holiday"])
    series_two = list(ahead.transformed.series_ids).index(2)
    assert (codes[series_two] == unknown).all()
    assert (codes[1 - series_two] == preprocessor.vocabularies["holiday"].index("none")).all()


def test_a_categorical_column_holding_only_a_missing_looking_category_keeps_that_category(
    preprocessor,
):
    # 'none' is a holiday category of training; a recent history and a future with no
    # holiday hold only 'none', which was read as empty cells: both were refused.
    history = history_table(12, "2021-04-01").assign(holiday="none")
    future = future_of(history)
    assert set(future["holiday"]) == {"none"}
    ahead, messages = forecast_inputs(preprocessor, history, future)
    assert messages == []
    arrays = ahead.windows.take(np.arange(2))
    none = preprocessor.vocabularies["holiday"].index("none")
    assert (arrays["future_categorical"] == none).all()
    assert (arrays["known_categorical_history"] == none).all()


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


def _ids_table(ids: list) -> pd.DataFrame:
    days = pd.date_range("2024-01-01", periods=30, freq="D")
    return pd.concat(
        [
            pd.DataFrame(
                {"store": [i] * 30, "day": days, "sales": 10.0 + k + np.sin(np.arange(30))}
            )
            for k, i in enumerate(ids)
        ],
        ignore_index=True,
    )


_ID_OPTIONS = dict(history=8, horizon=3, id_col="store", time_col="day", target="sales", freq="D")


def test_unsigned_ids_above_2_to_53_stay_distinct_integers_in_a_forecast():
    # The future rows' ids (int64) joined uint64 history ids as float64: 2^60 + 1 and
    # 2^60 + 2 became one float, and the forecast failed with pandas' KeyError.
    table = _ids_table([2**60 + 1, 2**60 + 2])
    table["store"] = table["store"].astype("uint64")
    fitted = prepare_dataset(table, **_ID_OPTIONS).preprocessor
    ahead = future_windows(fitted, table, None, 8, 3)
    assert ahead.transformed.series_ids == (2**60 + 1, 2**60 + 2)
    assert all(type(series) is int for series in ahead.transformed.series_ids)


@pytest.mark.parametrize(
    ("ids", "shown"),
    [
        ([(1, 2), (3, 4)], "tuple ids"),
        ([pd.Timestamp("2024-01-01"), pd.Timestamp("2024-02-01")], "Timestamp ids"),
    ],
    ids=["tuple", "timestamp"],
)
def test_ids_that_a_saved_run_cannot_list_are_refused_naming_the_column(ids, shown):
    # Tuple ids trained and saved, then `Forecaster.load` refused its own folder;
    # Timestamp ids trained, then `save` failed in json and left half a folder.
    with pytest.raises(TypeError, match=rf"id column 'store' holds {shown} .*texts or numbers"):
        prepare_dataset(_ids_table(ids), **_ID_OPTIONS)


def test_an_unseen_category_is_named_with_its_series_time_and_table(preprocessor, tmp_path):
    # The warning named the values only ("... coded as unknown: ['strike']"): a typo in
    # the forecast period changes the forecast, and could not be found from it.
    history = history_table(12, "2021-04-01")
    future = future_of(history)
    future.loc[(future["id"] == 2) & (future["time"] == "2021-04-01 12:00"), "holiday"] = "strike"
    _, messages = forecast_inputs(preprocessor, history, future)
    assert [m for m in messages if "not seen in training" in m] == [
        "categorical column 'holiday' has values not seen in training, coded as unknown: "
        "['strike'] ('strike' in 1 row of the future table, for series 2 at 2021-04-01 12:00:00)"
    ]
    # In both tables, and two values: each table's rows and first place, and the rows in all.
    history.loc[(history["id"] == 1) & (history["time"] == "2021-04-01 05:00"), "holiday"] = (
        "easter"
    )
    future.loc[future["id"] == 2, "holiday"] = "easter"
    future.loc[(future["id"] == 1) & (future["time"] == "2021-04-01 13:00"), "holiday"] = "strike"
    expected = (
        "categorical column 'holiday' has values not seen in training, coded as unknown: "
        "['easter', 'strike'] (4 rows in all: 'easter' in 1 row of {history}, for series 1 at "
        "2021-04-01 05:00:00 and in 2 rows of the future table, the first for series 2 at "
        "2021-04-01 12:00:00; 'strike' in 1 row of the future table, for series 1 at "
        "2021-04-01 13:00:00)"
    )
    _, messages = forecast_inputs(preprocessor, history, future)
    found = [m for m in messages if "not seen in training" in m]
    assert found == [expected.format(history="the history")]
    path = tmp_path / "history.csv"  # a history read from a file: the file is named
    history.to_csv(path, index=False)
    _, messages = forecast_inputs(preprocessor, str(path), future)
    found = [m for m in messages if "not seen in training" in m]
    assert found == [expected.format(history=f"the history (file {str(path)!r})")]
    # A fitted model's table (evaluation): its rows are the table's.
    scored = history_table()
    scored.loc[scored["time"] >= "2021-03-02 12:00", "holiday"] = "strike"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepare_dataset(
            scored, id_col="id", time_col="time", target="y", freq="h", history=HISTORY,
            horizon=HORIZON, known_cols=["promo", "holiday"], preprocessor=preprocessor,
        )  # fmt: skip
    found = [str(w.message) for w in caught if "not seen in training" in str(w.message)]
    assert found == [
        "categorical column 'holiday' has values not seen in training, coded as unknown: "
        "['strike'] ('strike' in 8 rows of the table, the first for series 1 at "
        "2021-03-02 12:00:00)"
    ]


def test_unseen_observed_and_static_categories_are_named_where_the_user_gave_them():
    # An observed column's future rows carry the history's last value (never read): the
    # future table did not give it, so it is not counted there. A static value is coded
    # once per series: named by series.
    table = history_table(40).assign(
        weather=lambda t: np.where(np.arange(len(t)) % 2, "sun", "rain"),
        region=lambda t: np.where(t["id"] == 1, "north", "south"),
    )
    data = quiet_prepare(
        table, freq="h", history=HISTORY, horizon=HORIZON, known_cols=["promo", "holiday"],
        observed_cols=["weather"], static_cols=["region"],
    )  # fmt: skip
    history = history_table(12, "2021-04-01").assign(weather="sun", region="north")
    history.loc[11, "weather"] = "hail"  # series 1's last row
    history.loc[history["id"] == 2, "region"] = "west"
    _, messages = forecast_inputs(data.preprocessor, history, future_of(history))
    found = sorted(m for m in messages if "not seen in training" in m)
    assert found == [
        "categorical column 'region' has values not seen in training, coded as unknown: "
        "['west'] ('west' in 1 series of the history, for series 2)",
        "categorical column 'weather' has values not seen in training, coded as unknown: "
        "['hail'] ('hail' in 1 row of the history, for series 1 at 2021-04-01 11:00:00)",
    ]


def test_a_series_whose_whole_forecast_lies_before_the_tables_end_is_named(preprocessor):
    # Each series is forecast from its own end: one that stopped long before the others
    # (a discontinued product) was forecast over a past period without a word.
    history = history_table(30, "2021-04-01")
    times = history["time"]
    early = times.max() - pd.Timedelta(hours=HORIZON + 1)
    ended = history[(history["id"] == 1) | (times <= early)]
    _, messages = forecast_inputs(preprocessor, ended, future_of(ended))
    named = [m for m in messages if "series end so long before" in m]
    assert named == [
        "1 of 2 series end so long before the table's last time 2021-04-02 05:00:00 that their "
        f"whole forecast (the {HORIZON} steps after each one's own last time) lies before it: "
        "2 (ends 2021-04-02 02:00:00); drop the series that ended, or give their recent history"
    ]
    # One step later: its forecast reaches the table's last time (series end unevenly).
    close = history[(history["id"] == 1) | (times <= early + pd.Timedelta(hours=1))]
    _, messages = forecast_inputs(preprocessor, close, future_of(close))
    assert not [m for m in messages if "series end so long before" in m]
