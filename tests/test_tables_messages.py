"""The messages of reading a long table: placeholders kept as categories, file lines.

A missing-value text ('n/a') in a column of text is a category, not an empty cell:
said once per table read. A row named in an error is its position among the data
rows, and, for a table read from a CSV file, also the line an editor shows. The
hint to list a column in categorical_cols is for inputs only, not the target.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data.future import future_windows
from tft_jax.data.tables import TableSpec, file_rows, read_table, validate_table

from .prepared_tables import HISTORY, HORIZON, daily_pair, prepare

KEPT = "category of its own"


def weather_pair() -> pd.DataFrame:
    """`daily_pair` with a known column of text, 'rain' and 'sun'."""
    table = daily_pair()
    table["weather"] = np.where(np.arange(len(table)) % 3 == 0, "sun", "rain")
    return table


def user_warnings(call, *args, **kwargs) -> tuple[object, list[str]]:
    """`call(*args, **kwargs)` and the messages of the user warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call(*args, **kwargs)
    return result, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def test_a_placeholder_in_a_text_column_is_announced_once_for_the_table():
    table = weather_pair()
    table.loc[[3, 4, 40], "weather"] = "n/a"  # in both series: still one warning
    dataset, messages = user_warnings(prepare, table, known_cols=("weather",))
    kept = [m for m in messages if KEPT in m]
    assert kept == [
        "column 'weather' holds 'n/a' in 3 rows, read as a category of its own (a text "
        "column's values are categories); leave those cells empty to mark them missing"
    ]
    assert "n/a" in dataset.preprocessor.vocabularies["weather"]  # not converted


def test_several_placeholders_and_columns_are_named_in_one_warning():
    table = weather_pair().assign(kind=lambda t: np.where(t["id"] == "a", "x", "y"))
    table.loc[3, "weather"] = " NULL "
    table.loc[5, "weather"] = "-"
    table.loc[4, "kind"] = "?"
    _, messages = user_warnings(prepare, table, known_cols=("weather", "kind"))
    kept = [m for m in messages if KEPT in m]
    assert len(kept) == 1
    assert kept[0].startswith(
        "column 'weather' holds ' NULL ' in 1 row, '-' in 1 row; column 'kind' holds '?' in "
        "1 row, each read as a category of its own"
    )


def test_everyday_categories_and_empty_cells_are_not_announced_as_placeholders():
    # 'NA' (North America) and 'None' (no holiday) are categories, and a placeholder
    # among numbers is read as missing (the other warning), not kept.
    table = weather_pair().assign(region=lambda t: np.where(t["id"] == "a", "NA", "EU"))
    table["holiday"] = np.where(np.arange(len(table)) % 7 == 0, "Xmas", "None")
    table["o"] = pd.Series(np.arange(len(table), dtype=float)).astype(object)
    table.loc[6, "o"] = "n/a"
    table.loc[8, "weather"] = None
    _, messages = user_warnings(
        prepare, table, known_cols=("weather", "holiday"), static_cols=("region",),
        observed_cols=("o",),
    )  # fmt: skip
    assert not [m for m in messages if KEPT in m]
    assert any(
        "read cells holding a missing-value text as missing: 1 in 'o'" in m for m in messages
    )


def test_a_fitted_category_spelled_as_a_placeholder_is_not_announced_again():
    table = weather_pair()
    table.loc[[1, 31], "weather"] = "n/a"
    fitted, messages = user_warnings(prepare, table, known_cols=("weather",))
    assert len([m for m in messages if KEPT in m]) == 1
    preprocessor = fitted.preprocessor
    assert "n/a" in preprocessor.vocabularies["weather"]
    # Scored, and forecast from: the fit announced it, the model knows the category.
    _, scored = user_warnings(prepare, table, known_cols=("weather",), preprocessor=preprocessor)
    assert not [m for m in scored if KEPT in m]
    last = table.groupby("id")["time"].max()
    future = pd.DataFrame(
        [(s, last[s] + pd.Timedelta(days=k + 1), "n/a") for s in "ab" for k in range(HORIZON)],
        columns=["id", "time", "weather"],
    )
    _, forecast = user_warnings(future_windows, preprocessor, table, future, HISTORY, HORIZON)
    assert not [m for m in forecast if KEPT in m]
    # A placeholder the fit did not see is new: announced.
    table.loc[[2, 32], "weather"] = "null"
    _, new = user_warnings(future_windows, preprocessor, table, future, HISTORY, HORIZON)
    assert [m for m in new if KEPT in m] == [
        "column 'weather' holds 'null' in 2 rows, read as a category of its own (a text "
        "column's values are categories); leave those cells empty to mark them missing"
    ]


def text_target_csv(tmp_path) -> tuple[pd.DataFrame, object]:
    """`daily_pair` with the target 'lots' at row 20, and the CSV file written of it."""
    table = daily_pair().astype({"y": object})
    table.loc[20, "y"] = "lots"
    path = tmp_path / "table.csv"
    table.to_csv(path, index=False)
    return table, path


def test_a_csv_error_names_the_file_line_of_the_row(tmp_path):
    table, path = text_target_csv(tmp_path)
    assert path.read_text().splitlines()[21].split(",")[2] == "lots"  # line 22
    with pytest.raises(
        ValueError,
        match=r"'lots' in series 'a' at row 20 \(line 22 of the file\), time 2024-01-21 00:00:00;",
    ):
        prepare(str(path))
    with pytest.raises(ValueError, match=r"'lots' in series 'a' at row 20, time 2024-01-21 "):
        prepare(table)  # a DataFrame has no lines


def test_a_csv_read_then_reordered_or_filtered_names_no_file_line(tmp_path):
    _, path = text_target_csv(tmp_path)
    read = read_table(path)
    assert file_rows(read) is not None
    assert file_rows(read.iloc[1:]) is None  # row 0 is line 3 now
    assert file_rows(read.sort_values("id", ascending=False)) is None
    assert file_rows(read.iloc[1:].reset_index(drop=True)) is None
    with pytest.raises(ValueError, match=r"'lots' in series 'a' at row 19, time 2024-01-21 "):
        prepare(read.iloc[1:].reset_index(drop=True))
    # The validated table is sorted: it keeps no record of the file.
    spec = TableSpec("id", "time", "y", freq="D")
    assert file_rows(validate_table(read.drop(index=20).reset_index(drop=True), spec, 2, 1)) is None


def test_csv_time_static_and_category_errors_name_file_lines(tmp_path):
    table = daily_pair()
    table["time"] = table["time"].dt.strftime("%Y-%m-%d").astype(object)
    table.loc[7, "time"] = "soon"
    path = tmp_path / "times.csv"
    table.to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"'soon' in series 'a' at row 7 \(line 9 of the file\)"):
        prepare(str(path))
    table = daily_pair().assign(region=lambda t: np.where(t["id"] == "a", "north", "south"))
    table.loc[35, "region"] = None
    path = tmp_path / "statics.csv"
    table.to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"empty for series 'b' \(row 35, line 37 of the file\)"):
        prepare(str(path), static_cols=("region",))
    table = daily_pair().assign(o=[f"{v:.1f}".replace(".", ",") for v in range(60)])
    path = tmp_path / "commas.csv"
    table.to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"'0,0' in series 'a' at row 0, line 2 of the file\)"):
        prepare(str(path), observed_cols=("o",))


def test_an_infinite_or_non_numeric_value_is_named_with_its_time_and_row(tmp_path):
    # Named by series and row only ("the first in series 'A' at row 395"), unlike the
    # errors beside them, which name the time: the row of a table sorted or filtered
    # before it was given is found by its time.
    table = daily_pair()
    table.loc[[33, 40], "y"] = [np.inf, -np.inf]
    with pytest.raises(ValueError) as caught:
        prepare(table)
    assert str(caught.value).startswith(
        "column 'y' has 2 infinite values, the first in series 'b' at row 33, "
        "time 2024-01-04 00:00:00; replace them"
    )
    path = tmp_path / "infinite.csv"
    table.to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"at row 33 \(line 35 of the file\), time 2024-01-04 "):
        prepare(str(path))
    # Aware times: named as read (the table's zone), as the other messages name them.
    aware = daily_pair().assign(time=lambda t: t["time"].dt.tz_localize("Europe/Berlin"))
    aware = aware.astype({"y": object})
    aware.loc[2, "y"] = "lots"
    with pytest.raises(ValueError) as caught:
        prepare(aware)
    assert "e.g. 'lots' in series 'a' at row 2, time 2024-01-03 00:00:00+01:00;" in str(
        caught.value
    )


def test_a_bad_future_value_is_named_with_its_time_in_the_historys_zone():
    # The future table's bad values were named by row only; the time is the history's
    # zone's, as in the future table's other messages, though the future is in UTC.
    table = daily_pair(20).assign(time=lambda t: t["time"].dt.tz_localize("Europe/Berlin"), k=1.0)
    fitted = prepare(table, known_cols=("k",)).preprocessor
    last = table.groupby("id")["time"].max()
    future = pd.DataFrame(
        [(s, last[s] + pd.Timedelta(days=k + 1), 1.0) for s in "ab" for k in range(HORIZON)],
        columns=["id", "time", "k"],
    ).astype({"k": object})
    future["time"] = future["time"].dt.tz_convert("UTC")
    for value, said in (("high", "1 non-numeric values, e.g. 'high'"), (np.inf, "1 infinite")):
        future.loc[3, "k"] = value
        with pytest.raises(ValueError) as caught:
            future_windows(fitted, table, future, HISTORY, HORIZON)
        message = str(caught.value)
        assert message.startswith(f"future table: column 'k' has {said}"), message
        assert "in series 'b' at row 3, time 2024-01-22 00:00:00+01:00;" in message


def test_the_categorical_hint_is_for_inputs_not_the_target():
    table = daily_pair().astype({"y": object})
    table.loc[4, "y"] = "high"
    with pytest.raises(ValueError, match=r"'y' has 1 non-numeric values") as caught:
        prepare(table)
    message = str(caught.value)
    assert "categorical_cols" not in message
    assert message.endswith("convert them to numbers (leave a cell empty to mark a missing value)")
    mixed = daily_pair().assign(o=["3"] * 59 + ["high"])
    with pytest.raises(
        ValueError, match=r"'o' has 1 non-numeric values.*list it in categorical_cols"
    ):
        prepare(mixed, observed_cols=("o",))


def test_a_fitted_model_is_offered_no_categorical_cols_and_a_future_csv_names_lines(tmp_path):
    # Its categorical columns are fixed at fit: "list it in categorical_cols
    # (--categorical-cols)" named a flag `predict` lacks and a change it cannot make.
    table = daily_pair().assign(o=np.arange(60.0), k=np.arange(60.0))
    fitted = prepare(table, observed_cols=("o",), known_cols=("k",)).preprocessor
    scored = table.astype({"o": object})
    scored.loc[7, "o"] = "high"
    with pytest.raises(ValueError, match=r"'o' has 1 non-numeric values") as caught:
        prepare(scored, observed_cols=("o",), known_cols=("k",), preprocessor=fitted)
    assert "categorical_cols" not in str(caught.value)
    last = table.groupby("id")["time"].max()
    future = pd.DataFrame(
        [(s, last[s] + pd.Timedelta(days=k + 1), 1.0) for s in "ab" for k in range(HORIZON)],
        columns=["id", "time", "k"],
    ).astype({"k": object})
    future.loc[2, "k"] = "high"
    path = tmp_path / "future.csv"
    future.to_csv(path, index=False)
    with pytest.raises(
        ValueError, match=r"future table: column 'k' .* at row 2 \(line 4 of the file\)"
    ) as caught:
        future_windows(fitted, table, read_table(str(path)), HISTORY, HORIZON)
    assert "categorical_cols" not in str(caught.value)


def test_a_column_numeric_at_fit_is_not_called_a_category_for_the_fitted_model():
    # It holds texts now: refused as non-numeric, not first announced as a category.
    table = daily_pair().assign(o=np.arange(60.0))
    fitted = prepare(table, observed_cols=("o",)).preprocessor
    texts = table.astype({"o": object})
    texts["o"] = np.where(np.arange(60) % 2 == 0, "low", "high")
    texts.loc[3, "o"] = "-"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"'o' has \d+ non-numeric values"):
            prepare(texts, observed_cols=("o",), preprocessor=fitted)
    assert not [w for w in caught if KEPT in str(w.message)]


def test_a_placeholder_among_numbers_written_with_commas_is_not_called_a_category():
    # The column is refused as numbers to read with decimal=',': it is no text column.
    table = daily_pair().assign(o=[f"{v:.1f}".replace(".", ",") for v in range(60)])
    table.loc[5, "o"] = "n/a"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"column 'o' holds numbers written with"):
            prepare(table, observed_cols=("o",))
    # Listed as categorical, its texts are the user's categories: 'n/a' is one.
    _, messages = user_warnings(prepare, table, observed_cols=("o",), categorical_cols=("o",))
    kept = [m for m in messages if KEPT in m]
    assert len(kept) == 1 and kept[0].startswith("column 'o' holds 'n/a' in 1 row, ")
