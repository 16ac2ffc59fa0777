"""`tft_jax.data.preprocessing`: vocabularies are the sorted distinct training values, codes
and the unseen-value warning equal each cell looked up alone, and a grid out of series
order transforms as the sorted one."""

from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset
from tft_jax.data.preprocessing import Preprocessor, RowSources
from tft_jax.data.tables import plain_value

from .prepared_tables import HISTORY, HORIZON, forecast_inputs, quiet_prepare


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


def test_an_unseen_id_or_category_gets_the_reserved_code_one_past_the_vocabulary():
    # Documented: unknown values are coded len(vocabulary), a code no known value has
    # (0 is the first id's / category's own code).
    preprocessor = Preprocessor(
        spec=None, series_ids=("s0", "s1", "s2"), origin=pd.Timestamp("2024-01-01"),
        train_steps=1.0, target_scaler=None, feature_scaler=None,
        vocabularies={"c": ("off", "on")},
    )  # fmt: skip
    codes = preprocessor.vocabulary_codes(["s1", "new", "s0", "s2"])
    np.testing.assert_array_equal(codes, [1, 3, 0, 2])
    with pytest.warns(UserWarning, match=r"'c' has values not seen in training.*'xmas'"):
        encoded = preprocessor.encode("c", pd.Series(["on", "xmas", "off"], dtype=object))
    np.testing.assert_array_equal(encoded, [1, 2, 0])


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


def test_the_rows_sources_follow_a_grid_out_of_series_order_into_the_unseen_warning():
    # `transform` sorts a grid out of series order: the future rows marked in the grid's
    # order must be the same rows after it, or the warning names the wrong table.
    times = pd.date_range("2024-01-01", periods=20, freq="D")
    table = pd.concat(
        [pd.DataFrame({"id": s, "time": times, "y": np.arange(20.0) * (k + 1),
                       "kind": np.where(np.arange(20) % 2, "x", "y")})
         for k, s in enumerate(["b", "a"])],
        ignore_index=True,
    )  # fmt: skip
    dataset = quiet_prepare(table, freq="D", history=4, horizon=2, known_cols=["kind"])
    grid = table.assign(y_missing=0.0)  # series 'b' first
    grid.loc[[19, 23], "kind"] = "z"  # 'b' at 2024-01-20, 'a' at 2024-01-04
    future = np.zeros(len(grid), dtype=bool)
    future[[18, 19]] = True  # the last two rows of 'b'
    with pytest.warns(UserWarning) as caught:
        dataset.preprocessor.transform(grid, sources=RowSources("the history", future=future))
    (message,) = [str(w.message) for w in caught if "not seen in training" in str(w.message)]
    assert message == (
        "categorical column 'kind' has values not seen in training, coded as unknown: ['z'] "
        "('z' in 1 row of the history, for series 'a' at 2024-01-04 00:00:00 and in 1 row of "
        "the future table, for series 'b' at 2024-01-20 00:00:00)"
    )


def statics_table(ids=("s0", "s1"), n: int = 30) -> pd.DataFrame:
    """Daily series with a categorical static 'region' and a real static 'size'."""
    times = pd.date_range("2024-01-01", periods=n, freq="D")
    return pd.concat(
        [pd.DataFrame({"id": series, "time": times, "y": np.arange(n) + 10.0 * k,
                       "region": ["north", "south"][k % 2], "size": float(k + 1)})
         for k, series in enumerate(ids)],
        ignore_index=True,
    )  # fmt: skip


def fitted_on(table: pd.DataFrame, **options) -> Preprocessor:
    """The preprocessor fitted on `table`, saved to JSON and loaded back as a run folder is."""
    fitted = quiet_prepare(table, freq="D", history=HISTORY, horizon=HORIZON, **options)
    return Preprocessor.from_json(json.loads(json.dumps(fitted.preprocessor.to_json())))


def test_a_trained_series_given_other_statics_is_announced_with_both_values():
    # An unseen static category was announced, another known one (a store moved to
    # another region) or a corrected area changed the forecasts without a word.
    saved = fitted_on(statics_table(), static_cols=["region", "size"])
    history = statics_table()
    assert forecast_inputs(saved, history, None)[1] == []
    history.loc[history["id"] == "s0", "region"] = "south"
    history.loc[history["id"] == "s1", "size"] = 2.5
    _, messages = forecast_inputs(saved, history, None)
    assert messages == [
        "2 static values of trained series differ from those they were trained with, and "
        "their forecasts follow the new ones: series 's0' column 'region': trained 'north', "
        "given 'south'; series 's1' column 'size': trained 2.0, given 2.5"
    ]
    # A run saved before the statics were kept loads, and has nothing to compare.
    old = saved.to_json()
    del old["statics"]
    assert forecast_inputs(Preprocessor.from_json(old), history, None)[1] == []


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda rows: rows.append(["zz", "north", 1.0]), r"lists 'zz', not a series of"),
        (lambda rows: rows[0].__setitem__(2, "big"), r"'size' of series 's0' must be a finite"),
        (lambda rows: rows[1].pop(), r"rows must be \[series id, one value per column"),
    ],
)
def test_damaged_statics_of_a_saved_run_are_refused_at_load(edit, message):
    described = fitted_on(statics_table(), static_cols=["region", "size"]).to_json()
    edit(described["statics"])
    with pytest.raises(ValueError, match=r"preprocessor.statics.*" + message):
        Preprocessor.from_json(described)


def test_new_ids_that_lost_their_leading_zeros_to_read_csv_are_told_how_to_keep_them(tmp_path):
    table = statics_table(ids=("001", "002"))
    saved = fitted_on(table)
    path = tmp_path / "history.csv"
    table.to_csv(path, index=False)
    read = pd.read_csv(path, parse_dates=["time"])  # as a user reads it: ids 1 and 2
    _, messages = forecast_inputs(saved, read, None)
    (named,) = [m for m in messages if "were not in the training data" in m]
    assert named.endswith(
        "; 1 is '001' in the training data as a number: did the CSV lose leading zeros? read "
        "it with pandas.read_csv(path, dtype={'id': str})"
    )
    # The advice read by pandas gives the trained ids back: no new series.
    advised = pd.read_csv(path, parse_dates=["time"], dtype={"id": str})
    assert not [m for m in forecast_inputs(saved, advised, None)[1] if "not in the training" in m]


def test_a_new_id_with_surrounding_spaces_is_named_with_the_trained_id():
    saved = fitted_on(statics_table())
    history = statics_table(ids=("s0 ", "s1"))
    _, messages = forecast_inputs(saved, history, None)
    (named,) = [m for m in messages if "were not in the training data" in m]
    assert named.startswith("series ['s0 '] were not in the training data")
    assert named.endswith(
        "; 's0 ' is 's0' in the training data but for surrounding spaces: strip them, e.g. "
        "df['id'] = df['id'].str.strip()"
    )


def test_a_new_constant_series_is_scaled_by_its_level_and_announced():
    # A series constant at 3e-9 (a sensor in SI units) was scaled by 1 in its units: its
    # forecast band was ~1e7 times its level wide.
    saved = fitted_on(statics_table())
    history = pd.concat([statics_table(), statics_table(ids=("tiny",)).assign(y=3e-9)])
    result, messages = forecast_inputs(saved, history, None)
    assert "1 series are constant in the history given here: 'tiny';" in "\n".join(messages)
    scaler = result.transformed.target_scaler
    code = result.transformed.series_ids.index("tiny")
    assert (scaler.loc[code], scaler.scale[code]) == (3e-9, 3e-9)


@pytest.mark.parametrize("scaler", ["target_scaler", "static_scaler"])
@pytest.mark.parametrize("scale", [0.0, -1.0])
def test_a_saved_scale_of_zero_or_below_is_refused_at_load(scaler, scale):
    # A zero scale divides by zero at the first forecast: a scale must be > 0.
    described = fitted_on(statics_table(), static_cols=["region", "size"]).to_json()
    described[scaler]["scale"][0] = scale
    with pytest.raises(ValueError, match=rf"preprocessor.{scaler}.scale must be positive"):
        Preprocessor.from_json(described)


def test_categorical_cardinalities_are_the_training_values_plus_the_unknown_code():
    # Codes run 0..len(vocabulary), the last one for unseen values: an embedding table
    # of len(vocabulary) rows would have no row for it.
    table = statics_table(ids=("s0", "s1", "s2"))
    table["promo"] = np.where(np.arange(len(table)) % 3 == 0, "on", "off")
    table["code"] = np.arange(len(table)) % 4
    dataset = quiet_prepare(
        table, freq="D", history=HISTORY, horizon=HORIZON, static_cols=["region"],
        known_cols=["promo", "code"], categorical_cols=["code"],
    )  # fmt: skip
    preprocessor = dataset.preprocessor
    train = table[table["time"] < dataset.validation_start]
    expected_known = tuple(
        train[name].nunique() + 1 for name in preprocessor.known_categorical_names
    )
    assert sorted(preprocessor.known_categorical_names) == ["code", "promo"]
    assert preprocessor.known_categorical_cardinalities == expected_known
    # Statics: the series id (3 ids + unknown), then 'region' (north, south + unknown).
    assert preprocessor.static_categorical_cardinalities == (4, 3)


def test_missing_inputs_are_zero_the_scaled_location_not_the_scaled_raw_zero():
    # Series 'b' (levels near 110) has no target on its first 5 days and an observed
    # input 'temp' missing on its first 3 days (nothing before to carry forward): those
    # model inputs are 0 (the scaler's location), not (0 - mean) / std, nor NaN.
    table = statics_table(ids=("a", "b"))[["id", "time", "y"]]
    table.loc[table["id"] == "b", "y"] += 100.0
    late = (table["id"] == "b") & (table["time"] < pd.Timestamp("2024-01-06"))
    table.loc[late, "y"] = np.nan
    table["temp"] = 20.0 + np.arange(len(table)) % 7
    gap = (table["id"] == "b") & (table["time"] < pd.Timestamp("2024-01-04"))
    table.loc[gap, "temp"] = np.nan
    dataset = quiet_prepare(
        table, freq="D", history=HISTORY, horizon=HORIZON, observed_cols=["temp"]
    )
    panel = dataset.train.panel
    b = int(dataset.preprocessor.series_ids.index("b"))
    start = int(panel.series_start[b])
    rows = start + np.arange(int(panel.series_length[b]))
    days = (
        pd.DatetimeIndex(table.loc[table["id"] == "b", "time"]) - pd.Timestamp("2024-01-01")
    ).days
    assert int(panel.series_length[b]) == 30 and list(days) == list(range(30))
    target_input, temp_input = panel.observed[rows, 0], panel.observed[rows, 1]
    np.testing.assert_array_equal(target_input[:5], 0.0)
    np.testing.assert_array_equal(temp_input[:3], 0.0)
    assert np.isfinite(panel.observed).all()


def test_a_saved_preprocessor_holds_every_key_null_for_a_part_it_has_not():
    # Absent keys are read as the runs saved before them (no static scaler: raw statics),
    # so in a folder of format version 2 (`complete`) a deleted key is refused.
    fitted = fitted_on(statics_table())
    without = dataclasses.replace(fitted, static_scaler=None, statics=None)
    described = json.loads(json.dumps(without.to_json()))
    assert described["static_scaler"] is None and described["statics"] is None
    assert set(described["feature_scaler"]) == {"loc", "scale", "low", "high"}
    loaded = Preprocessor.from_json(described, complete=True)
    assert loaded.static_scaler is None and loaded.statics is None
    assert json.loads(json.dumps(loaded.to_json())) == described
    del described["statics"]
    Preprocessor.from_json(described)  # a folder of format version 1 may lack it
    with pytest.raises(ValueError, match=r"preprocessor lacks the keys \['statics'\]"):
        Preprocessor.from_json(described, complete=True)
