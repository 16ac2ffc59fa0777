"""Categorical columns read the same whatever pandas dtype holds their values, and a category
spelled like a missing value ('NA') is read as itself at forecast and at scoring."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset
from tft_jax.data.future import future_windows

from .prepared_tables import daily_pair, forecast_inputs, prepare, quiet_prepare

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
    with pytest.warns(UserWarning, match="coded 1 empty cells of categorical inputs"):
        fitted = prepare_dataset(table.assign(shift=codes.astype("category")), **SPEC)
    assert fitted.preprocessor.vocabularies["shift"] == (0, 1, 2)  # not '0.0', '1.0', '2.0'
    halves = table.assign(shift=(table["shift"] + 0.5).astype("category"))
    with pytest.raises(ValueError, match=r"categorical column 'shift' has non-integer codes, "
                       r"e\.g\. 0\.5 in series 'a' at row 0"):  # fmt: skip
        prepare_dataset(halves, **SPEC)


@pytest.mark.parametrize("dtype", ["int64", "uint64", "Int64", "category"])
def test_64_bit_integer_codes_keep_their_own_categories(dtype):
    # Hashed SKU or store codes past 2**53 went through float64 and merged: three
    # kinds 2**60 + 1, 2, 3 became one category 2**60, a value not in the table.
    table = shifts()
    base = 2**60 if dtype != "uint64" else 2**63
    codes = (table["shift"].to_numpy().astype(np.uint64) + np.uint64(base + 1)).astype(object)
    fitted = prepare_dataset(table.assign(shift=pd.Series(codes, dtype=dtype)), **SPEC)
    assert fitted.preprocessor.vocabularies["shift"] == (base + 1, base + 2, base + 3)
    expected = prepare_dataset(table, **SPEC)  # the codes 0, 1, 2 in the same cells
    np.testing.assert_array_equal(fitted.panel.known_categorical,
                                  expected.panel.known_categorical)  # fmt: skip


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


def regions_table() -> tuple[pd.DataFrame, dict]:
    """Hourly series 'a' and 'c' of region 'NA' (North America), 'b' of 'EU', and the
    options that read 'region' as a static column."""
    times = pd.date_range("2021-01-01", periods=30, freq="h")
    table = pd.concat(
        [pd.DataFrame({"id": series, "time": times, "y": np.sin(np.arange(30.0)) + k,
                       "region": region})
         for k, (series, region) in enumerate((("a", "NA"), ("b", "EU"), ("c", "NA")))],
        ignore_index=True,
    )  # fmt: skip
    return table, dict(freq="h", history=HISTORY, horizon=HORIZON, static_cols=["region"])


def test_a_static_category_spelled_like_a_missing_value_is_read_as_itself():
    table, options = regions_table()
    fitted = quiet_prepare(table, **options).preprocessor
    assert fitted.vocabularies["region"] == ("EU", "NA")
    # Forecasting the North American series only: every region cell is 'NA'.
    only_na = table[table["id"] != "b"]
    ahead, messages = forecast_inputs(fitted, only_na, None)
    assert messages == []
    region = ahead.windows.take(np.arange(2))["static_categorical"][:, 1]
    assert (region == fitted.vocabularies["region"].index("NA")).all()


def test_a_scored_table_is_read_with_the_fitted_spec_so_an_inferred_category_stays():
    # 'region' was inferred categorical at fit (the user's spec does not list it); a
    # scored table holding only the 'NA' region was read with the user's spec,
    # its cells emptied as missing, and the table refused.
    table, options = regions_table()
    fitted = quiet_prepare(table, **options).preprocessor
    assert "region" not in options.get("categorical_cols", ())
    scored = quiet_prepare(table[table["id"] != "b"], preprocessor=fitted, **options)
    codes = scored.split("train").arrays()["static_categorical"][:, 1]
    assert len(codes) and (codes == fitted.vocabularies["region"].index("NA")).all()
