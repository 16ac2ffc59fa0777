"""Empty cells of categorical inputs: a category of their own, not filled.

An event column is empty on ordinary days; filled forward (and back before a
series' first event) every day read as the last (or next) event, and an empty
future cell was refused. Now a fit codes them as unknown, the code values
unseen in training share; a run saved before (format 3 and earlier,
`Preprocessor.fills_empty_categoricals`) still fills them, as it was trained.
Codes are checked against a pandas reading of the raw table.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset
from tft_jax.data.preprocessing import Preprocessor

from .prepared_tables import HISTORY, HORIZON, forecast_inputs

EVENTS = {("a", 5): "xmas", ("a", 11): "easter", ("b", 8): "xmas"}
ABSENT = {("b", 14)}  # a row the grid inserts


def _table(days: int = 30) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for series in "ab":
        for day in range(days):
            if (series, day) in ABSENT:
                continue
            rows.append(
                {
                    "id": series,
                    "time": pd.Timestamp("2024-01-01") + pd.Timedelta(days=day),
                    "y": 10.0 + rng.normal(),
                    "promo": np.nan if (series, day) == ("a", 3) else float(day % 2),
                    "event": EVENTS.get((series, day)),
                }
            )
    return pd.DataFrame(rows)


def _prepare(table: pd.DataFrame, **options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = prepare_dataset(
            table, id_col="id", time_col="time", target="y", freq="D", history=HISTORY,
            horizon=HORIZON, known_cols=["promo", "event"], **options,
        )  # fmt: skip
    return data, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def _expected_codes(table: pd.DataFrame, vocabulary: tuple, fill: bool) -> np.ndarray:
    """The `event` code of every grid row by (id, time), from the raw table in pandas."""
    grid = []
    for _, rows in table.groupby("id", sort=True):
        times = pd.date_range(rows["time"].min(), rows["time"].max(), freq="D")
        events = rows.set_index("time")["event"].reindex(times)
        if fill:
            events = events.ffill().bfill()
        grid.extend(events.tolist())
    unknown = len(vocabulary)
    return np.array([unknown if pd.isna(v) else vocabulary.index(v) for v in grid])


def test_a_fit_codes_empty_categorical_cells_as_unknown_and_fills_the_real_ones():
    table = _table()
    data, messages = _prepare(table)
    assert data.preprocessor.fills_empty_categoricals is False
    vocabulary = data.preprocessor.vocabularies["event"]
    assert vocabulary == ("easter", "xmas")  # no day after an event reads as one
    codes = data.panel.known_categorical[:, 0]
    np.testing.assert_array_equal(codes, _expected_codes(table, vocabulary, fill=False))
    assert (codes == 2).sum() == 2 * 30 - 3  # the inserted row too
    # The empty promo cell is still filled (forward, within its series).
    promo = data.frame.set_index(["id", "time"])["promo"]
    assert promo[("a", pd.Timestamp("2024-01-04"))] == promo[("a", pd.Timestamp("2024-01-03"))]
    coded = [m for m in messages if m.startswith("coded ")]
    filled = [m for m in messages if m.startswith("filled ") and "empty cells" in m]
    assert len(coded) == 1 and coded[0].startswith(
        "coded 56 empty cells of categorical inputs as a category of their own, the one "
        "values unseen in training share"
    )
    assert "'event' 56 cells in 2 of 2 series ('a', 'b')" in coded[0]
    assert "leading" not in coded[0]  # no cell is filled, before a first value or after
    assert len(filled) == 1 and "'promo' 1 cells" in filled[0] and "'event'" not in filled[0]


def test_a_run_saved_before_fills_them_as_it_was_trained():
    table = _table()
    fitted, _ = _prepare(table)
    older = dataclasses.replace(fitted.preprocessor, fills_empty_categoricals=True)
    data, messages = _prepare(table, preprocessor=older)
    vocabulary = older.vocabularies["event"]
    np.testing.assert_array_equal(
        data.panel.known_categorical[:, 0], _expected_codes(table, vocabulary, fill=True)
    )
    assert not any(m.startswith("coded ") for m in messages)
    assert any("'event' 56 cells" in m for m in messages if m.startswith("filled "))


def _future(history: pd.DataFrame, events: list) -> pd.DataFrame:
    last = history.groupby("id")["time"].max()
    rows = [
        (series, end + pd.Timedelta(days=step), 1.0, events[step - 1])
        for series, end in last.items()
        for step in range(1, HORIZON + 1)
    ]
    return pd.DataFrame(rows, columns=["id", "time", "promo", "event"])


def test_an_empty_future_cell_is_coded_as_an_unseen_value_is_unless_the_run_filled():
    table = _table()
    preprocessor = _prepare(table)[0].preprocessor
    history = table[table["time"] < "2024-01-25"]
    empty, messages = forecast_inputs(preprocessor, history, _future(history, [None, "xmas"]))
    unseen, _ = forecast_inputs(preprocessor, history, _future(history, ["diwali", "xmas"]))
    codes = empty.windows.arrays()["future_categorical"][..., 0]
    np.testing.assert_array_equal(codes, [[2, 1], [2, 1]])
    np.testing.assert_array_equal(unseen.windows.arrays()["future_categorical"][..., 0], codes)
    assert any(
        m.startswith("coded 2 empty cells of categorical inputs in future") for m in messages
    )
    older = dataclasses.replace(preprocessor, fills_empty_categoricals=True)
    with pytest.raises(ValueError, match=r"future column 'event' is empty for series 'a'"):
        forecast_inputs(older, history, _future(history, [None, "xmas"]))


def test_the_setting_is_saved_and_a_folder_before_format_4_reads_as_filled():
    preprocessor = _prepare(_table())[0].preprocessor
    saved = preprocessor.to_json()
    assert saved["fills_empty_categoricals"] is False
    assert Preprocessor.from_json(saved, complete=True, format_version=4).to_json() == saved
    earlier = {key: value for key, value in saved.items() if key != "fills_empty_categoricals"}
    for version in (2, 3):
        loaded = Preprocessor.from_json(earlier, complete=True, format_version=version)
        assert loaded.fills_empty_categoricals is True
    assert Preprocessor.from_json(earlier).fills_empty_categoricals is True
    with pytest.raises(ValueError, match=r"lacks the keys \['fills_empty_categoricals'\]"):
        Preprocessor.from_json(earlier, complete=True, format_version=4)
    with pytest.raises(TypeError, match="fills_empty_categoricals must be true or false"):
        Preprocessor.from_json({**saved, "fills_empty_categoricals": "no"}, complete=True)


def test_a_series_without_any_event_trains_and_forecasts_unless_the_run_filled():
    # Empty throughout a series was refused ("no values at all for series 'b'"): a store
    # that never had an event, or a history window without one, could not be used.
    table = _table()
    quiet = table.assign(event=table["event"].where(table["id"] == "a"))
    data, _ = _prepare(quiet)
    codes = data.panel.known_categorical[data.panel.series_code == 1, 0]
    assert (codes == len(data.preprocessor.vocabularies["event"])).all()
    history = quiet[quiet["time"] >= "2024-01-20"]  # no event left in either series
    inputs, _ = forecast_inputs(data.preprocessor, history, _future(history, [None, None]))
    assert (inputs.windows.arrays()["known_categorical_history"][..., 0] == 2).all()
    older = dataclasses.replace(data.preprocessor, fills_empty_categoricals=True)
    with pytest.raises(ValueError, match=r"column 'event' has no values at all for series 'a'"):
        forecast_inputs(older, history, _future(history, ["xmas", "xmas"]))
