"""A model fitted on a DataFrame, then given the same table as a CSV path.

pandas reads a CSV's digit strings as numbers ('007' as 7), which a model
fitted on text codes knows under no code; the library reads such columns as
text when the fitted values are text. References are the codes of the same
table given as a DataFrame, and the vocabulary positions themselves.
"""

from __future__ import annotations

import pathlib
import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset, read_table
from tft_jax.data.future import FutureWindows, future_windows
from tft_jax.data.preprocessing import Preprocessor

HISTORY, HORIZON, STEPS = 8, 4, 40
SPEC = dict(
    id_col="id", time_col="time", target="y", static_cols=["grade"], freq="h",
    categorical_cols=["grade"],
)  # fmt: skip


def _table(series: list[tuple[object, object]]) -> pd.DataFrame:
    """(series * STEPS, 4) hourly rows of `(id, grade)` pairs, a static 'grade'."""
    times = pd.date_range("2021-03-01", periods=STEPS, freq="h")
    rng = np.random.default_rng(0)
    return pd.concat(
        [
            pd.DataFrame({"id": sid, "time": times, "y": rng.normal(size=STEPS), "grade": grade})
            for sid, grade in series
        ],
        ignore_index=True,
    )


# Ids and grades as digit strings, no id with a leading zero (so the id
# column's own leading-zero rule does not apply); grade '007' has one.
TEXT = _table([("12", "007"), ("5", "3"), ("9", "3")])


@pytest.fixture(scope="module")
def fitted_on_text() -> Preprocessor:
    preprocessor = prepare_dataset(TEXT, history=HISTORY, horizon=HORIZON, **SPEC).preprocessor
    assert preprocessor.series_ids == ("12", "5", "9")
    assert preprocessor.vocabularies["grade"] == ("007", "3")
    return preprocessor


def _forecast_inputs(
    preprocessor: Preprocessor, table: pd.DataFrame | pathlib.Path
) -> tuple[FutureWindows, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ahead = future_windows(preprocessor, table, None, HISTORY, HORIZON)
    return ahead, [str(warning.message) for warning in caught]


def test_csv_of_digit_codes_codes_as_the_dataframe(fitted_on_text, tmp_path):
    # A new series '42' of an unseen grade '9' next to the trained ones.
    history = pd.concat([TEXT, _table([("42", "9")])], ignore_index=True)
    path = tmp_path / "history.csv"
    history.to_csv(path, index=False)
    frame_read, frame_warnings = _forecast_inputs(fitted_on_text, history)
    csv_read, csv_warnings = _forecast_inputs(fitted_on_text, path)
    assert csv_read.transformed.series_ids == frame_read.transformed.series_ids
    assert csv_read.transformed.series_ids == ("12", "42", "5", "9")
    np.testing.assert_array_equal(
        csv_read.windows.panel.static_categorical, frame_read.windows.panel.static_categorical
    )
    # Independent: (series code, grade code) of each series by vocabulary position;
    # 3 is the unknown series code, 2 the unknown grade code.
    expected = [[0, 0], [3, 2], [1, 1], [2, 1]]
    np.testing.assert_array_equal(csv_read.windows.panel.static_categorical, expected)
    # The same warnings, but for the file named where the history's rows are named.
    named = f"the history (file {str(path)!r})"
    assert csv_warnings == [
        message.replace("of the history,", f"of {named},") for message in frame_warnings
    ]
    assert any(named in message for message in csv_warnings)
    assert any("['9']" in message for message in csv_warnings)  # only the unseen grade
    assert not any("astype" in message for message in csv_warnings)


def test_csv_holding_numbers_where_training_had_text_keeps_the_type_hint(fitted_on_text, tmp_path):
    path = tmp_path / "floats.csv"
    TEXT.assign(grade=TEXT["grade"].astype(float)).to_csv(path, index=False)  # '7.0', '3.0'
    _, messages = _forecast_inputs(fitted_on_text, path)
    assert any("3 (int) is '3' (str) in training" in message for message in messages), messages


def test_ints_fitted_and_read_from_csv_stay_ints(tmp_path):
    table = _table([(12, 7), (5, 3)])
    preprocessor = prepare_dataset(table, history=HISTORY, horizon=HORIZON, **SPEC).preprocessor
    path = tmp_path / "ints.csv"
    table.to_csv(path, index=False)
    frame_read, _ = _forecast_inputs(preprocessor, table)
    csv_read, messages = _forecast_inputs(preprocessor, path)
    assert csv_read.transformed.series_ids == (5, 12)
    assert not any("unknown" in message or "not in the training" in message for message in messages)
    np.testing.assert_array_equal(
        csv_read.windows.panel.static_categorical, frame_read.windows.panel.static_categorical
    )


def test_read_table_fitted_texts_and_dataframes_untouched(tmp_path):
    path = tmp_path / "cells.csv"
    path.write_text("id,grade,size\n1,007,inf\n2,42,1\n3,,2\n")
    fitted = {"id": ("1", "2"), "grade": ("007", "3"), "size": ("1", "2")}
    read = read_table(path, "utf-8", "id", fitted)
    assert read["id"].tolist() == ["1", "2", "3"]
    assert read["grade"].tolist()[:2] == ["007", "42"]
    assert pd.isna(read["grade"].iloc[2])
    assert read["size"].tolist() == ["inf", "1", "2"]  # no twin of a fitted text: text
    # Fitted on numbers, or no fit: pandas' numbers, as before.
    assert read_table(path, "utf-8", "id", {"id": (1, 2)})["id"].tolist() == [1, 2, 3]
    assert read_table(path, "utf-8", "id")["grade"].iloc[0] == 7
    frame = pd.DataFrame({"id": [1, 2], "grade": [7, 3]})
    assert read_table(frame, "utf-8", "id", fitted) is frame


def test_a_csv_evaluated_with_the_fitted_preprocessing_codes_as_the_dataframe(
    fitted_on_text, tmp_path
):
    # The evaluate/backtest path: `prepare_dataset(table, preprocessor=...)`.
    path = tmp_path / "table.csv"
    TEXT.to_csv(path, index=False)
    options = dict(history=HISTORY, horizon=HORIZON, preprocessor=fitted_on_text, **SPEC)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no series or grade is new
        from_csv = prepare_dataset(path, **options)
    from_frame = prepare_dataset(TEXT, **options)
    assert from_csv.series_ids == from_frame.series_ids == ("12", "5", "9")
    np.testing.assert_array_equal(
        from_csv.test.panel.static_categorical, from_frame.test.panel.static_categorical
    )


def test_a_declared_categorical_whose_codes_numbers_would_merge_is_read_as_text(tmp_path):
    # Grades '01' and '1' are two categories; read as numbers both were 1, one category.
    table = _table([("a", "01"), ("b", "1"), ("c", "2")])
    path = tmp_path / "grades.csv"
    table.to_csv(path, index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dataset = prepare_dataset(path, history=HISTORY, horizon=HORIZON, **SPEC)
    assert dataset.preprocessor.vocabularies["grade"] == ("01", "1", "2")
    # Codes that read as numbers unchanged stay numbers, as before.
    plain = tmp_path / "plain.csv"
    _table([("a", "1"), ("b", "2")]).to_csv(plain, index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        numbers = prepare_dataset(plain, history=HISTORY, horizon=HORIZON, **SPEC)
    assert numbers.preprocessor.vocabularies["grade"] == (1, 2)
    # A model fitted on those numbers reads a CSV by its vocabulary, not by the rule.
    read = read_table(path, "utf-8", "id", numbers.preprocessor.fitted_values, ["grade"])
    assert read["grade"].tolist()[:1] == [1]


def test_categories_and_ids_spelled_like_missing_values_read_as_the_dataframe(tmp_path):
    # pandas' default na_values emptied 'NA' and 'None' in a CSV: a static region
    # 'NA' (North America) was refused as empty, an id 'NA' too, and a holiday
    # column's 'None' days were filled with the neighbouring 'Xmas'.
    days = pd.date_range("2024-01-01", periods=40, freq="D")
    holiday = np.where(np.arange(40) % 10 == 1, "Xmas", "None")
    frame = pd.concat(
        [
            pd.DataFrame(
                {
                    "store": store,
                    "day": days,
                    "sales": 10.0 + k + np.sin(np.arange(40)),
                    "region": region,
                    "holiday": holiday,
                }
            )
            for k, (store, region) in enumerate([("NA", "NA"), ("GB", "EU")])
        ]
    )
    path = tmp_path / "table.csv"
    frame.to_csv(path, index=False)
    options = dict(
        history=8,
        horizon=3,
        id_col="store",
        time_col="day",
        target="sales",
        freq="D",
        static_cols=("region",),
        known_cols=("holiday",),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing read as missing, nothing filled
        from_csv = prepare_dataset(path, **options)
    from_frame = prepare_dataset(frame, **options)
    assert from_csv.series_ids == from_frame.series_ids == ("GB", "NA")
    assert from_csv.preprocessor.vocabularies == {
        "region": ("EU", "NA"),
        "holiday": ("None", "Xmas"),
    }
    panel, want = from_csv.train.panel, from_frame.train.panel
    np.testing.assert_array_equal(panel.known_categorical, want.known_categorical)
    np.testing.assert_array_equal(panel.static_categorical, want.static_categorical)
    vocabulary = from_csv.preprocessor.vocabularies["holiday"]
    assert [vocabulary[code] for code in panel.known_categorical[:12, 0]] == list(holiday[:12])
