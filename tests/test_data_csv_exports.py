"""CSV files as exports write them, read by the data layer: a header repeating a name, rows
ending with a delimiter, compressed or UTF-16 files under a plain name, percentages, ids
padded with spaces or in another case, and day-first dates whose days are all 12 or less.

Each is refused naming the file (and its line or fields), or read as written with a
warning; never read otherwise without a word. The functions that read tables are
called directly: no model is trained.

References: the tables the files were written from (`DataFrame.to_csv`), and the
times they hold (`pd.date_range`).
"""

from __future__ import annotations

import gzip
import pathlib
import re
import shutil
import warnings
import zipfile
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tft_jax.data.dataset import prepare_dataset
from tft_jax.data.tables import (
    TableSpec,
    file_rows,
    infer_categorical,
    read_announced,
    read_table,
    validate_table,
)

SPEC = TableSpec("store", "date", "sales", known_cols=("promo",), freq="D")


def base_table(days: int = 12, ids: str = "AB") -> pd.DataFrame:
    """A daily table of `ids` with a known promo and the target."""
    times = pd.date_range("2024-01-01", periods=days, freq="D")
    return pd.DataFrame(
        [
            (store, time.strftime("%Y-%m-%d"), float(i % 3 == 0), 100.0 + 10 * k + i)
            for k, store in enumerate(ids)
            for i, time in enumerate(times)
        ],
        columns=["store", "date", "promo", "sales"],
    )


def write(path: pathlib.Path, lines: list[str]) -> pathlib.Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def user_warnings(run: Any) -> tuple[Any, list[str]]:
    """`run()` and the messages of the user warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run()
    return result, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


# ------------------------------------------------------------- a header repeating a name


def test_a_header_repeating_a_needed_name_is_refused_naming_the_file_and_its_fields(tmp_path):
    table = base_table()
    lines = ["store,date,promo,sales,sales"] + [
        f"{r.store},{r.date},{r.promo},{r.sales * 1000},{r.sales}" for r in table.itertuples()
    ]
    path = write(tmp_path / "dup.csv", lines)
    read = read_table(path)
    assert list(read.columns) == ["store", "date", "promo", "sales", "sales.1"]  # pandas'
    expected = (
        f"table {path} has repeated column labels among the columns it needs: 'sales' "
        "(2 columns: fields 4, 5 of the header, line 1)"
    )
    for run in (
        lambda: validate_table(read, SPEC, 3, 2),
        lambda: read_announced(path, SPEC),
    ):
        with pytest.raises(ValueError) as error:
            run()
        assert expected in str(error.value)
        assert "'sales.1'" in str(error.value)  # why the first was used before


def test_a_header_repeating_an_unneeded_name_reads_as_the_same_dataframe_does(tmp_path):
    table = base_table()
    lines = ["store,note,date,promo,sales,note"] + [
        f"{r.store},x,{r.date},{r.promo},{r.sales},y" for r in table.itertuples()
    ]
    read = read_table(write(tmp_path / "notes.csv", lines))
    clean = validate_table(read, SPEC, 3, 2)
    assert clean["sales"].tolist() == table["sales"].tolist()
    # Once renamed, the columns are the caller's: 'sales.1' is a column of its own.
    dup = write(
        tmp_path / "dup.csv",
        ["store,date,promo,sales,sales"]
        + [f"{r.store},{r.date},{r.promo},{r.sales},1" for r in table.itertuples()],
    )
    renamed = read_table(dup).rename(columns={"sales.1": "other"})
    assert len(validate_table(renamed, SPEC, 3, 2)) == len(table)
    # A name that only looks renamed ('sales.1' written so) is no repeat.
    written = write(
        tmp_path / "dotted.csv",
        ["store,date,promo,sales.1"]
        + [f"{r.store},{r.date},{r.promo},{r.sales}" for r in table.itertuples()],
    )
    spec = TableSpec("store", "date", "sales.1", known_cols=("promo",), freq="D")
    assert len(validate_table(read_table(written), spec, 3, 2)) == len(table)


# -------------------------------------------------------- rows ending with a delimiter


def test_rows_ending_with_an_empty_field_are_read_without_it_and_announced(tmp_path):
    table = base_table()
    path = tmp_path / "trailing.csv"
    plain = table.to_csv(index=False).splitlines()
    write(path, [plain[0]] + [line + "," for line in plain[1:]])
    read, messages = user_warnings(lambda: read_table(path))
    assert messages == [
        f"{path}: its rows end with an extra empty field (a delimiter after the last of the "
        "header's 4 names, e.g. line 2); read without it"
    ]
    assert list(read.columns) == ["store", "date", "promo", "sales"]
    assert read["store"].tolist() == table["store"].tolist()
    assert read["date"].tolist() == table["date"].tolist()
    assert read["sales"].tolist() == table["sales"].tolist()
    assert file_rows(read) is not None and file_rows(read).line(0) == 2
    clean = validate_table(read, SPEC, 3, 2)
    assert clean["sales"].tolist() == table["sales"].tolist()


def test_a_row_with_a_value_past_the_header_is_refused_naming_its_line(tmp_path):
    plain = base_table().to_csv(index=False).splitlines()
    rows = [line + "," for line in plain[1:]]
    rows[2] = rows[2] + "oops"  # line 4 of the file
    path = write(tmp_path / "extra.csv", [plain[0], *rows])
    with pytest.raises(ValueError) as error:
        read_table(path)
    message = str(error.value)
    assert message.startswith(f"{path}: line 4 has 5 fields, one more than the header")
    assert "'oops'" in message and "give that field a name in the header" in message


def test_rows_starting_with_row_labels_the_header_does_not_name_read_as_before(tmp_path):
    # R's write.table(sep=","): a distinct label before each row, none in the header. pandas
    # reads the labels as the index and the columns line up: no trailing field to drop.
    table = base_table()
    lines = ["store,date,promo,sales"] + [
        f"{i + 1},{r.store},{r.date},{r.promo},{r.sales}" for i, r in enumerate(table.itertuples())
    ]
    path = write(tmp_path / "labels.csv", lines)
    read, messages = user_warnings(lambda: read_table(path))
    assert messages == []
    assert list(read.columns) == ["store", "date", "promo", "sales"]
    assert read["store"].tolist() == table["store"].tolist()
    assert read["sales"].tolist() == table["sales"].tolist()
    assert validate_table(read, SPEC, 3, 2)["sales"].tolist() == table["sales"].tolist()


def test_a_repeated_first_field_with_a_value_past_the_header_is_refused_not_shifted(tmp_path):
    # The header lacks the last column's name: pandas would make the ids the index.
    table = base_table()
    lines = ["store,date,promo"] + [
        f"{r.store},{r.date},{r.promo},{r.sales}" for r in table.itertuples()
    ]
    path = write(tmp_path / "unnamed.csv", lines)
    with pytest.raises(ValueError) as error:
        read_table(path)
    message = str(error.value)
    assert message.startswith(f"{path}: line 2 has 4 fields, one more than the header")
    assert "its first fields repeat, 'A' on more than one line: not row labels" in message


def test_the_extra_field_warning_points_at_the_caller_of_prepare_dataset(tmp_path):
    plain = base_table(days=60).to_csv(index=False).splitlines()
    path = write(tmp_path / "trailing.csv", [plain[0]] + [line + "," for line in plain[1:]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepare_dataset(
            path, id_col="store", time_col="date", target="sales", freq="D", history=3,
            horizon=2, known_cols=("promo",),
        )  # fmt: skip
    (warning,) = [w for w in caught if "extra empty field" in str(w.message)]
    assert warning.filename == __file__  # as the sibling warnings of `read_announced`


# ------------------------------------------------- compressed and UTF-16 files, by content


def test_utf16_text_is_told_its_encoding_whatever_encoding_was_passed(tmp_path):
    table = base_table()
    path = tmp_path / "unicode.csv"
    table.to_csv(path, index=False, encoding="utf-16")  # Excel's "Unicode Text" has a BOM
    for encoding in ("utf-8", "latin-1"):
        with pytest.raises(ValueError) as error:
            read_table(path, encoding)
        assert str(error.value) == (
            f"{path} is UTF-16 text (it begins with the byte-order mark FF FE), not "
            f"{encoding}: pass encoding='utf-16' (--encoding utf-16)"
        )
    read = read_table(path, "utf-16")
    assert read["sales"].tolist() == table["sales"].tolist()


def test_latin1_text_keeps_the_latin1_hint(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes("store,date,sales\nM\xfcnchen,2024-01-01,1\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"byte 0xfc .*encoding='latin-1'"):
        read_table(path)


def test_compressed_files_without_their_ending_are_told_to_be_renamed(tmp_path):
    text = base_table().to_csv(index=False).encode()
    gz = tmp_path / "sales.csv"
    gz.write_bytes(gzip.compress(text))
    with pytest.raises(ValueError) as error:
        read_table(gz)
    assert str(error.value).startswith(f"{gz} is gzip-compressed")
    assert "rename it to end in '.gz'" in str(error.value)
    assert "latin-1" not in str(error.value)
    renamed = tmp_path / "sales.csv.gz"
    shutil.copy(gz, renamed)  # what the message says to do reads it
    assert read_table(renamed)["sales"].tolist() == base_table()["sales"].tolist()

    zipped = tmp_path / "zipped.csv"
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("sales.csv", text)
    with pytest.raises(ValueError, match=r"zipped\.csv is zip-compressed.*'\.zip'"):
        read_table(zipped)

    plain = tmp_path / "plain.csv.gz"
    plain.write_bytes(text)
    with pytest.raises(ValueError, match=r"named '\.gz' but is not gzip-compressed"):
        read_table(plain)


def test_text_beginning_like_a_magic_number_or_named_tgz_reads_as_text(tmp_path):
    # bzip2's 'BZh' and Parquet's 'PAR1' are ASCII; pandas infers no compression from '.tgz'.
    table = base_table().rename(columns={"promo": "BZh9"})
    bz = tmp_path / "bz.csv"
    table[["BZh9", "store", "date", "sales"]].to_csv(bz, index=False)
    assert read_table(bz)["sales"].tolist() == table["sales"].tolist()
    par = tmp_path / "par.csv"
    table.rename(columns={"BZh9": "PAR1"})[["PAR1", "store", "date", "sales"]].to_csv(
        par, index=False
    )
    assert read_table(par)["sales"].tolist() == table["sales"].tolist()
    tgz = tmp_path / "sales.tgz"
    base_table().to_csv(tgz, index=False, compression=None)
    assert read_table(tgz)["sales"].tolist() == base_table()["sales"].tolist()


def test_an_excel_workbook_is_told_to_be_saved_as_csv(tmp_path):
    book = tmp_path / "sales.xlsx"
    with zipfile.ZipFile(book, "w") as archive:
        archive.writestr("xl/workbook.xml", "<workbook/>")
    with pytest.raises(ValueError, match=r"is an Excel workbook, not CSV text.*read_excel"):
        read_table(book)


# ------------------------------------------------------------------------- percentages


def test_a_known_column_of_percentages_is_refused_with_the_conversion_that_reads_it(tmp_path):
    table = base_table()
    table["promo"] = (np.arange(len(table)) % 7 * 2.5).astype(str) + "%"
    path = tmp_path / "percent.csv"
    table.to_csv(path, index=False)
    read = read_table(path)
    with pytest.raises(ValueError) as error:
        infer_categorical(read, SPEC)
    message = str(error.value)
    assert message.startswith(
        "column 'promo' holds percentages (e.g. '0.0%' in series 'A' at row 0, line 2 of the "
        "file), which would be read as 7 categories"
    )
    assert message.endswith(
        "or, if it holds categories, list it in categorical_cols (--categorical-cols)"
    )
    # The suggested line converts them.
    line = re.search(r"df\['promo'\] = (.+?) \(for the CLI", message).group(1)
    read["promo"] = eval(line, {"df": read})
    assert infer_categorical(read, SPEC) == SPEC
    assert read["promo"].tolist()[:3] == [0.0, 0.025, 0.05]
    # Listed as categorical, they are categories.
    listed = TableSpec("store", "date", "sales", known_cols=("promo",), categorical_cols=("promo",))
    assert infer_categorical(table, listed) == listed


def test_percentages_with_decimal_commas_are_told_to_replace_the_comma():
    table = base_table()
    table["promo"] = ["12,5%", "0%", "3,25 %"] * (len(table) // 3)
    with pytest.raises(ValueError) as error:
        infer_categorical(table, SPEC)
    line = re.search(r"df\['promo'\] = (.+?) \(for the CLI", str(error.value)).group(1)
    assert ".str.replace(',', '.')" in line
    assert eval(line, {"df": table}).tolist()[:3] == [0.125, 0.0, 0.0325]


def test_a_text_column_with_one_percentage_stays_categorical():
    table = base_table()
    table["promo"] = ["low", "high", "mid"] * (len(table) // 3)
    table.loc[5, "promo"] = "50%"
    spec = infer_categorical(table, SPEC)
    assert spec.categorical_cols == ("promo",)


def test_a_target_of_percentages_is_refused_with_the_conversion():
    table = base_table()
    table["sales"] = table["sales"].astype(str) + "%"
    with pytest.raises(ValueError) as error:
        validate_table(table, SPEC, 3, 2)
    message = str(error.value)
    assert "column 'sales' has 24 non-numeric values, e.g. '100.0%'" in message
    assert "'100.0%' (series 'A', row 0) is a percentage" in message
    assert "df['sales'].str.strip().str.rstrip('%').astype(float) / 100" in message


def test_placeholders_among_percentages_are_not_announced_as_categories(tmp_path):
    table = base_table()
    table["promo"] = ["12%", "3%", "n/a"] * (len(table) // 3)
    path = tmp_path / "percent.csv"
    table.to_csv(path, index=False)
    _, messages = user_warnings(lambda: read_announced(path, SPEC))
    assert not any("category of its own" in m for m in messages), messages


# ------------------------------------------------------- ids differing by spaces or case


def test_ids_differing_only_by_surrounding_spaces_are_announced_and_kept_apart():
    table = base_table(days=20)
    table.loc[15:19, "store"] = "A "
    clean, messages = user_warnings(lambda: validate_table(table, SPEC, 3, 2))
    assert sorted(clean["store"].unique()) == ["A", "A ", "B"]  # not repaired
    assert messages == [
        "id column 'store' holds a group of ids that differ only by surrounding spaces, each "
        "id read as a series of its own: 'A' (15 rows) and 'A ' (5 rows); if each group is "
        "one series, strip the spaces (df['store'] = df['store'].str.strip()) before fitting "
        "(for the CLI, write a copy so cleaned)"
    ]


def test_ids_differing_by_case_are_announced_with_the_first_few_groups():
    ids = "ABCDEFGH"
    table = base_table(days=4, ids=ids + ids.lower())
    clean, messages = user_warnings(lambda: validate_table(table, SPEC, 2, 1))
    assert clean["store"].nunique() == 16
    (message,) = messages
    assert message.startswith(
        "id column 'store' holds 8 groups of ids that differ only by letter case, each id "
        "read as a series of its own: 'A' (4 rows) and 'a' (4 rows); 'B' (4 rows) and "
        "'b' (4 rows);"
    )
    assert "'E' (4 rows) and 'e' (4 rows) and 3 more;" in message
    assert "write them in one case (e.g. df['store'] = df['store'].str.upper())" in message


def test_id_twins_of_both_kinds_name_both_fixes_and_a_fitted_model_is_not_told_again():
    table = base_table(days=4, ids="AB")
    extra = base_table(days=4, ids="a").assign(store=" a ")
    table = pd.concat([table, extra], ignore_index=True)
    _, messages = user_warnings(lambda: validate_table(table, SPEC, 2, 1))
    (message,) = messages
    assert "differ only by surrounding spaces or letter case" in message
    assert "'A' (4 rows) and ' a ' (4 rows)" in message
    assert "strip the spaces" in message and "write them in one case" in message
    _, fitted = user_warnings(lambda: validate_table(table, SPEC, 2, 1, fitted=True))
    assert fitted == []


def test_distinct_ids_and_numeric_ids_give_no_twin_warning():
    for ids in ("AB", "ab"):
        table = base_table(ids=ids)
        _, messages = user_warnings(lambda table=table: validate_table(table, SPEC, 3, 2))
        assert messages == []
    numbers = base_table().assign(store=lambda t: t["store"].map({"A": 1, "B": 2}))
    _, messages = user_warnings(lambda: validate_table(numbers, SPEC, 3, 2))
    assert messages == []


# --------------------------------------------------- day-first dates read month first


def day_first_table(times: pd.DatetimeIndex, text: str = "%d/%m/%Y") -> pd.DataFrame:
    return pd.DataFrame(
        [(store, time.strftime(text), 100.0 + i) for store in "AB" for i, time in enumerate(times)],
        columns=["store", "date", "sales"],
    )


def test_day_first_dates_read_as_months_are_told_to_read_day_first_not_monthly():
    days = pd.date_range("2024-01-01", periods=12, freq="D")
    table = day_first_table(days)  # '02/01/2024': every day and month at most 12
    spec = TableSpec("store", "date", "sales", freq="D")
    with pytest.raises(ValueError) as error:
        validate_table(table, spec, 3, 2)
    message = str(error.value)
    assert "it looks recorded every MS" in message
    assert "; pass that frequency" not in message
    assert message.endswith(
        "but its times are texts with day and month both 12 or less, which read day first "
        "fill the grid ('02/01/2024' is 2024-02-01 as read (month first), 2024-01-02 day "
        "first): if they are day/month/year, pass dayfirst=True (--dayfirst) or "
        "time_format='%d/%m/%Y' (--time-format), not that frequency"
    )
    # What it says reads them as written.
    for fix in ({"dayfirst": True}, {"time_format": "%d/%m/%Y"}):
        fixed = TableSpec("store", "date", "sales", freq="D", **fix)
        clean = validate_table(table, fixed, 3, 2)
        assert list(clean["date"].iloc[:12]) == list(days)


def test_times_with_two_separators_are_no_day_first_candidates():
    # '01/02-2024' took the day-first path and failed with an IndexError; pandas reads them.
    table = base_table(days=3)
    table["date"] = table["date"].map(lambda t: f"{t[8:10]}/{t[5:7]}-{t[:4]}")
    clean = validate_table(table, SPEC, 1, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pandas' "could not infer format"
        as_pandas_reads = pd.to_datetime(table["date"].iloc[:3])
    assert list(clean["date"].iloc[:3]) == list(as_pandas_reads)


def test_dotted_day_first_dates_name_their_format():
    days = pd.date_range("2024-01-01", periods=12, freq="D")
    table = day_first_table(days, "%d.%m.%y")
    expected = r"fill the grid .*time_format='%d\.%m\.%y'"
    # pandas reads such texts one by one, which is announced: not what is checked here.
    with pytest.raises(ValueError, match=expected), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        validate_table(table, TableSpec("store", "date", "sales", freq="D"), 3, 2)


def test_month_first_dates_that_read_no_better_day_first_keep_the_frequency_advice():
    # Monthly US dates over two years: read day first they are 1-12 January of each year.
    months = pd.date_range("2023-01-01", periods=24, freq="MS")
    table = day_first_table(months, "%m/%d/%Y")
    with pytest.raises(ValueError) as error:
        validate_table(table, TableSpec("store", "date", "sales", freq="D"), 3, 2)
    message = str(error.value)
    assert "it looks recorded every MS" in message
    assert "; pass that frequency; if the times are day/month/year ('02/01/2023' is " in message
    assert "pass dayfirst=True (--dayfirst) or time_format='%d/%m/%Y'" in message
    # Given their frequency, they are read without a word.
    spec = TableSpec("store", "date", "sales", freq="MS")
    clean, messages = user_warnings(lambda: validate_table(table, spec, 3, 2))
    assert messages == [] and list(clean["date"].iloc[:24]) == list(months)


def test_iso_dates_and_unambiguous_day_first_dates_are_not_given_the_day_order_hint():
    days = pd.date_range("2024-01-01", periods=40, freq="D")
    spec = TableSpec("store", "date", "sales", freq="W")
    for text in ("%Y-%m-%d", "%m/%d/%Y"):  # days above 12: read one way only
        with pytest.raises(ValueError) as error:
            validate_table(day_first_table(days, text), spec, 3, 2)
        assert "dayfirst" not in str(error.value)
