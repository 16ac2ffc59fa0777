"""A table in modern pandas dtypes (Arrow texts, dates and timestamps, dictionary-encoded or
`category` columns) forecasts exactly as the same table in plain NumPy/object dtypes.

`read_csv`/`read_parquet(dtype_backend="pyarrow")` give such tables; each test fits or
forecasts from one and compares with the plain table's forecasts (the reference), or, where
a column cannot be read, with a message naming it and the fix.
"""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pandas as pd
import pytest

from tft_jax.data.tables import TableSpec, missing_texts, validate_table
from tft_jax.forecaster import DataConfig, Forecaster

from .cli_tables import HISTORY, HORIZON, TINY_TRAINING, write_table
from .forecaster_stores import MODEL

pa = pytest.importorskip("pyarrow")

DATA = DataConfig(
    id_col="store", time_col="day", target="sales", freq="D", static_cols=("size", "kind"),
    known_cols=("promo", "weather"), observed_cols=("temperature", "shift"), history=HISTORY,
    horizon=HORIZON, validation_fraction=0.15, test_fraction=0.15,
)  # fmt: skip
CUT = pd.Timestamp("2024-04-03")  # the forecast starts here: the table's last HORIZON days
FUTURE = ["store", "day", "promo", "weather"]


def plain_table(folder: pathlib.Path) -> pd.DataFrame:
    """The stores table with text inputs (a static, a known, an observed one), times as
    NumPy datetimes and ids as texts."""
    table = pd.read_csv(write_table(folder / "stores.csv"))
    table["day"] = pd.to_datetime(table["day"])
    table["kind"] = table["store"].map({"alpha": "big", "beta": "small", "gamma": "big"})
    table["weather"] = np.where(np.arange(len(table)) % 3 == 0, "rain", "sun")
    table["shift"] = np.where(np.arange(len(table)) % 4 == 0, "early", "late")
    return table


def fit(table: pd.DataFrame) -> Forecaster:
    return Forecaster(DATA, MODEL, TINY_TRAINING).fit(table, quiet=True)


def forecast(forecaster: Forecaster, table: pd.DataFrame) -> pd.DataFrame:
    """The forecast of the days from CUT, from the days before it and their known inputs."""
    days = pd.DatetimeIndex(table["day"])
    return forecaster.predict(table[days < CUT], table.loc[days >= CUT, FUTURE])


def scores(metrics: dict) -> dict:
    """`Forecaster.evaluate`'s metrics less the seconds each model took (which vary)."""
    if not isinstance(metrics, dict):
        return metrics
    return {key: scores(value) for key, value in metrics.items() if key != "seconds"}


def arrow(values: pd.Series, dtype) -> pd.Series:
    return values.astype(pd.ArrowDtype(dtype))


def dictionary(values: pd.Series) -> pd.Series:
    return arrow(values, pa.dictionary(pa.int32(), pa.string()))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Forecaster, pd.DataFrame, pd.DataFrame]:
    """`(forecaster, plain table, its forecast)`: the model fitted on `plain_table`."""
    table = plain_table(tmp_path_factory.mktemp("stores"))
    forecaster = fit(table)
    return forecaster, table, forecast(forecaster, table)


def test_arrow_text_inputs_fit_as_their_plain_texts(reference):
    """Arrow texts in a static, a known and an observed column are categories, as texts are
    (they were refused as 'non-numeric values' to convert to numbers)."""
    _, table, expected = reference
    modern = table.assign(
        kind=arrow(table["kind"], pa.string()),
        weather=dictionary(table["weather"]),
        shift=arrow(table["shift"], pa.large_string()),
    )
    pd.testing.assert_frame_equal(forecast(fit(modern), table), expected)


def test_a_parquet_table_read_with_the_pyarrow_backend(reference, tmp_path):
    """The table written to parquet and read back in Arrow dtypes (large strings,
    timestamp[us], doubles) forecasts and scores as the table it was written from."""
    forecaster, table, expected = reference
    table.to_parquet(tmp_path / "stores.parquet")
    read = pd.read_parquet(tmp_path / "stores.parquet", dtype_backend="pyarrow")
    assert isinstance(read["day"].dtype, pd.ArrowDtype)
    pd.testing.assert_frame_equal(forecast(forecaster, read), expected)
    assert scores(forecaster.evaluate(read)) == scores(forecaster.evaluate(table))


@pytest.mark.parametrize("dtype", ["string", "large_string"])
def test_arrow_texts_keep_a_missing_value_text_as_a_category(dtype):
    """'n/a' among texts is a category, of Arrow texts as of plain ones: it was emptied
    (pandas reads the texts as NaN numbers, which are not missing values in Arrow)."""
    plain = pd.DataFrame({"weather": ["rain", "n/a", "sun", None, "n/a"]}, dtype=object)
    expected, counts = missing_texts(plain, ["weather"])
    arrow_type = getattr(pa, dtype)()
    got, got_counts = missing_texts(plain.assign(weather=arrow(plain["weather"], arrow_type)),
                                    ["weather"])  # fmt: skip
    assert got_counts == counts == {}
    pd.testing.assert_series_equal(got["weather"], arrow(expected["weather"], arrow_type))


@pytest.mark.parametrize(
    ("dtype", "numpy_dtype"),
    [("date32", "datetime64[s]"), ("timestamp[ns]", "datetime64[ns]")],
)
def test_arrow_times_read_as_numpy_datetimes(reference, dtype, numpy_dtype):
    """Arrow dates and timestamps forecast, evaluate and backtest as NumPy datetimes of the
    same unit (dates crashed in pandas: `dt.tz is not supported for date32[day]`)."""
    forecaster, table, _ = reference
    arrow_type = pa.date32() if dtype == "date32" else pa.timestamp("ns")
    modern = table.assign(day=arrow(table["day"], arrow_type))
    plain = table.assign(day=table["day"].astype(numpy_dtype))
    pd.testing.assert_frame_equal(forecast(forecaster, modern), forecast(forecaster, plain))
    assert scores(forecaster.evaluate(modern)) == scores(forecaster.evaluate(plain))
    pd.testing.assert_frame_equal(
        forecaster.backtest(modern, n_windows=2), forecaster.backtest(plain, n_windows=2)
    )


@pytest.mark.parametrize("arrow_type", [pa.timestamp("ns"), pa.date32(), pa.string()])
def test_arrow_times_of_the_future_table(reference, arrow_type):
    """The future's times in Arrow dtypes are read as the history's NumPy ones (a naive
    timestamp[ns] failed in pandas' merge: 'trying to merge on datetime64[us] and
    timestamp[ns][pyarrow] columns')."""
    forecaster, table, expected = reference
    days = table["day"]
    future = table.loc[days >= CUT, FUTURE]
    given = future["day"].dt.strftime("%Y-%m-%d") if arrow_type == pa.string() else future["day"]
    future = future.assign(day=arrow(given, arrow_type))
    pd.testing.assert_frame_equal(forecaster.predict(table[days < CUT], future), expected)


def test_aware_arrow_timestamps_keep_their_zone():
    """An aware Arrow timestamp column is read as the NumPy one of the same zone."""
    times = pd.date_range("2024-03-28", periods=8, freq="D", tz="Europe/Berlin")
    plain = pd.DataFrame({"id": "a", "time": times, "y": np.arange(8.0)})
    spec = TableSpec(id_col="id", time_col="time", target="y", freq="D")
    modern = plain.assign(time=arrow(plain["time"], pa.timestamp("us", tz="Europe/Berlin")))
    expected = validate_table(plain, spec, history=4, horizon=2)
    pd.testing.assert_frame_equal(validate_table(modern, spec, history=4, horizon=2), expected)
    assert str(expected["time"].dt.tz) == "Europe/Berlin"


def test_category_ids_fit_as_their_values(reference):
    """Ids of a `category` column (categories in another order than their values, one
    unused) train the model the same ids as texts do, and list the series in the same order
    (they were sorted by category order: another model, rows in another order)."""
    _, table, expected = reference
    ids = pd.Categorical(table["store"], categories=["gamma", "zeta", "alpha", "beta"])
    got = forecast(fit(table.assign(store=ids)), table)
    pd.testing.assert_frame_equal(got, expected)


def test_integer_category_ids_read_as_the_integers():
    """Integer categories are read as an int64 id column: same ids, same order."""
    times = pd.date_range("2024-01-01", periods=6, freq="D")
    plain = pd.DataFrame(
        {"id": np.repeat([7, 3, 5], 6), "time": np.tile(times, 3), "y": np.arange(18.0)}
    )
    spec = TableSpec(id_col="id", time_col="time", target="y", freq="D")
    ids = pd.Categorical(plain["id"], categories=[5, 9, 7, 3])
    expected = validate_table(plain, spec, history=3, horizon=2)
    got = validate_table(plain.assign(id=ids), spec, history=3, horizon=2)
    pd.testing.assert_frame_equal(got, expected)
    assert expected["id"].drop_duplicates().tolist() == [3, 5, 7]


@pytest.mark.parametrize("kind", ["dictionary", "string", "large_string"])
def test_arrow_ids_read_as_their_texts(reference, kind):
    """Dictionary-encoded Arrow ids are read as their texts (they were refused as 'str ids
    ...: series ids must be texts or numbers'), in the history and the future; Arrow texts
    as before."""
    forecaster, table, expected = reference
    convert = dictionary if kind == "dictionary" else (lambda s: arrow(s, getattr(pa, kind)()))
    modern = table.assign(store=convert(table["store"]))
    pd.testing.assert_frame_equal(forecast(forecaster, modern), expected)
    assert scores(forecaster.evaluate(modern)) == scores(forecaster.evaluate(table))


def test_category_time_columns_read_as_their_values(reference):
    """A `category` time column is read as its categories: texts parsed, as a column of
    them is; integers refused as numbers, not read as nanoseconds since 1970."""
    forecaster, table, expected = reference
    texts = table.assign(day=table["day"].dt.strftime("%Y-%m-%d").astype("category"))
    pd.testing.assert_frame_equal(forecast(forecaster, texts), expected)
    digits = table["day"].dt.strftime("%Y%m%d").astype(int).astype("category")
    with pytest.raises(ValueError, match=r"column 'day' holds numbers \(int64\), not timestamps"):
        forecaster.evaluate(table.assign(day=digits))


@pytest.mark.parametrize("levels", [["day"], ["store", "day"]])
def test_a_column_in_the_index_is_named_there(reference, levels):
    """A time or id column moved to the index (`set_index`) is said to be there, with
    `reset_index()`, at fit, for a fitted model and in the future table."""
    forecaster, table, _ = reference
    indexed = table.set_index(levels)
    said = re.escape(str(levels)) + r" (is|are) in the table's index .*df\.reset_index\(\)"
    with pytest.raises(ValueError, match=said) as refused:
        fit(indexed)
    assert "Rename the columns" not in str(refused.value)  # they are there, in the index
    with pytest.raises(ValueError, match=said) as refused:
        forecaster.evaluate(indexed)
    assert "add them to the table" not in str(refused.value)
    days = table["day"]
    future = table.loc[days >= CUT, FUTURE].set_index(levels)
    with pytest.raises(ValueError, match=said):
        forecaster.predict(table[days < CUT], future)
