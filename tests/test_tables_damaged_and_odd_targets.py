"""Reading odd tables: damaged compressed files and archives, values beyond float32, booleans.

A compressed file that does not decompress, or an archive holding other than one
file, is refused in one line naming the path (not a traceback of gzip, zipfile or
tarfile); a tar archive under a name pandas infers no tar from is refused, not read
as text. A value beyond float32's range is refused when the table is validated, at
fit as at predict. A boolean target is read as 0/1 and announced; a boolean input is
read silently.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import re
import tarfile
import warnings
import zipfile
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from tft_jax.data.future import future_windows
from tft_jax.data.tables import TableSpec, read_table, validate_table

from .prepared_tables import HISTORY, HORIZON, daily_pair, prepare

FLOAT32_MAX = float(np.finfo(np.float32).max)
SPEC = TableSpec(id_col="id", time_col="time", target="y", freq="D")


def csv_bytes(n: int = 60) -> bytes:
    """A daily table of two series as CSV, with noisy values (its compressed forms exceed
    200 bytes)."""
    table = daily_pair(n)
    table["y"] += np.random.default_rng(0).normal(size=len(table)).round(4)
    return table.to_csv(index=False).encode()


def tar_bytes(mode: str, files: dict[str, bytes]) -> bytes:
    """A tar archive (`mode` 'w', 'w:gz' ...) holding `files`, in memory."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def zip_bytes(files: dict[str, bytes]) -> bytes:
    """A zip archive holding `files`, in memory."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def flipped(data: bytes, start: int, stop: int) -> bytes:
    """`data` with its bytes `start:stop` inverted."""
    return data[:start] + bytes(b ^ 0xFF for b in data[start:stop]) + data[stop:]


def user_warnings(call: Callable[[], object]) -> list[str]:
    """The messages of the UserWarnings `call()` emits."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


# ------------------------------------------------------------ damaged compressed files

GZIP = gzip.compress(csv_bytes())
DAMAGED = {
    # name: (bytes, what the message says the file is)
    "truncated.csv.gz": (GZIP[:200], "a damaged or truncated gzip file (Compressed file ended"),
    "truncated.csv.xz": (lzma.compress(csv_bytes())[:200], "a damaged or truncated xz file"),
    "truncated.csv.bz2": (bz2.compress(csv_bytes())[:200], "a damaged or truncated bzip2 file"),
    "flipped.csv.gz": (flipped(GZIP, 40, 60), "a damaged or truncated gzip file"),
    "crc.csv.gz": (GZIP[:-8] + b"\0\0\0\0" + GZIP[-4:], "a damaged or truncated gzip file (CRC"),
    "flipped.csv.xz": (flipped(lzma.compress(csv_bytes()), 60, 80), "a damaged or truncated xz"),
    "garbage.zip": (b"PK\x03\x04" + b"garbage" * 40, "a damaged or truncated zip file"),
    "text.tar": (csv_bytes(), "not a tar archive, or a damaged or truncated one"),
    "truncated.tar.gz": (tar_bytes("w:gz", {"a.csv": csv_bytes()})[:200], "not a tar archive"),
}


@pytest.mark.parametrize("name", list(DAMAGED))
def test_a_damaged_compressed_file_is_refused_in_one_line_naming_it(tmp_path, name):
    # gzip's EOFError, zlib.error, BadGzipFile (CRC), zipfile.BadZipFile and tarfile's
    # ReadError came through as tracebacks naming no file.
    data, what = DAMAGED[name]
    assert len(GZIP) > 200
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ValueError) as error:
        read_table(path)
    message = str(error.value)
    assert message.startswith(f"{path} is {what}"), message
    assert "\n" not in message
    assert re.search(r"download or (compress|create) it again", message)


@pytest.mark.parametrize(
    ("name", "data", "held"),
    [
        ("two.zip", zip_bytes({"a.csv": b"x\n1\n", "b.csv": b"x\n2\n"}), "2 files (a.csv, b.csv)"),
        ("none.zip", zip_bytes({}), "no file"),
        ("two.tar", tar_bytes("w", {"a.csv": b"x\n1\n", "b.csv": b"x\n2\n"}), "2 files (a.csv"),
        ("two.tar.gz", tar_bytes("w:gz", {"a.csv": b"x\n", "b.csv": b"x\n"}), "2 files (a.csv"),
    ],
)
def test_an_archive_of_other_than_one_file_is_refused_naming_it_and_its_files(
    tmp_path, name, data, held
):
    # pandas' "Multiple files found in ZIP file" named no path; an empty zip archive
    # (its end record alone) was called "not zip-compressed".
    path = tmp_path / name
    path.write_bytes(data)
    kind = "zip" if name.endswith(".zip") else "tar"
    with pytest.raises(ValueError) as error:
        read_table(path)
    assert str(error.value).startswith(f"{path} is a {kind} archive holding {held}")
    assert "extract the CSV to read" in str(error.value)


@pytest.mark.parametrize(
    ("name", "mode", "ending"),
    [("sales.csv", "w", ".tar"), ("sales.csv.gz", "w:gz", ".tar.gz"),
     ("sales.tgz", "w:gz", ".tar.gz"), ("sales.csv.xz", "w:xz", ".tar.xz")],
)  # fmt: skip
def test_a_tar_archive_under_another_name_is_refused_not_read_as_text(tmp_path, name, mode, ending):
    # A plain tar named '.csv' (or a gzip one named '.csv.gz') was read as CSV text: the
    # tar header became the columns, silently; '.tgz' was told to be renamed '.gz'.
    path = tmp_path / name
    path.write_bytes(tar_bytes(mode, {"sales.csv": csv_bytes()}))
    with pytest.raises(ValueError) as error:
        read_table(path)
    message = str(error.value)
    assert re.match(rf"{re.escape(str(path))} is an? (\w+-compressed )?tar archive", message)
    assert f"rename it to end in {ending!r}" in message


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("sales.csv.gz", gzip.compress),
        ("sales.csv.bz2", bz2.compress),
        ("sales.csv.xz", lzma.compress),
        ("sales.zip", lambda data: zip_bytes({"sales.csv": data})),
        ("sales.tar", lambda data: tar_bytes("w", {"sales.csv": data})),
        ("sales.tar.gz", lambda data: tar_bytes("w:gz", {"sales.csv": data})),
        ("sales.tar.bz2", lambda data: tar_bytes("w:bz2", {"sales.csv": data})),
        ("sales.tar.xz", lambda data: tar_bytes("w:xz", {"sales.csv": data})),
        # tarfile opens a compressed archive whatever its ending, and so does pandas.
        ("gzipped.tar", lambda data: tar_bytes("w:gz", {"sales.csv": data})),
    ],
)
def test_a_valid_compressed_file_or_archive_of_one_csv_reads_as_the_csv(tmp_path, name, make):
    data = csv_bytes()
    path = tmp_path / name
    path.write_bytes(make(data))
    pd.testing.assert_frame_equal(read_table(path), pd.read_csv(io.BytesIO(data)))


# ------------------------------------------------------------ values beyond float32


def beyond_message(column: str, count: int, value: str, where: str, power: int) -> str:
    """The message refusing `count` values of `column` beyond float32, the first at `where`."""
    return (
        f"column {column!r} has {count} values beyond float32 (largest 3.4e+38), the first "
        f"{value} in {where}; model inputs must be finite in float32: correct them or leave "
        "them empty (a placeholder for a missing value?), or rescale the column (e.g. divide "
        f"it by 1e{power})"
    )


def test_a_target_beyond_float32_is_refused_at_fit_naming_series_row_and_time():
    # It was fitted: its series' scale included it, and the series was forecast ~1e298.
    table = daily_pair()
    table.loc[5, "y"] = 1e300
    with pytest.raises(ValueError) as error:
        prepare(table)
    assert str(error.value) == beyond_message(
        "y", 1, "1e+300", "series 'a' at row 5, time 2024-01-06 00:00:00", 300
    )


def test_an_input_beyond_float32_is_refused_at_fit_and_in_a_future_table():
    table = daily_pair().assign(promo=0.0)
    table.loc[33, "promo"] = -1e39
    with pytest.raises(ValueError) as error:
        prepare(table, known_cols=["promo"])
    assert str(error.value) == beyond_message(
        "promo", 1, "-1e+39", "series 'b' at row 33, time 2024-01-04 00:00:00", 39
    )
    fitted = prepare(daily_pair().assign(promo=0.0), known_cols=["promo"]).preprocessor
    history = daily_pair().assign(promo=0.0)
    future = pd.DataFrame(
        {"id": ["a", "a", "b", "b"], "time": pd.to_datetime(["2024-01-31", "2024-02-01"] * 2),
         "promo": [0.0, 5e38, 0.0, 0.0]}
    )  # fmt: skip
    with pytest.raises(ValueError) as error:
        future_windows(fitted, history, future, HISTORY, HORIZON)
    assert str(error.value) == "future table: " + beyond_message(
        "promo", 1, "5e+38", "series 'a' at row 1, time 2024-02-01 00:00:00", 38
    )


def test_a_history_beyond_float32_is_refused_at_predict_as_at_fit():
    fitted = prepare(daily_pair()).preprocessor
    history = daily_pair()
    history.loc[[40, 41], "y"] = 1e300
    with pytest.raises(ValueError) as error:
        future_windows(fitted, history, None, HISTORY, HORIZON)
    assert str(error.value) == beyond_message(
        "y", 2, "1e+300", "series 'b' at row 40, time 2024-01-11 00:00:00", 300
    )


def test_a_csv_value_beyond_float32_is_named_with_its_file_line(tmp_path):
    path = tmp_path / "sales.csv"
    table = daily_pair()
    table.loc[3, "y"] = 2.5e300
    table.to_csv(path, index=False)
    with pytest.raises(ValueError) as error:
        prepare(read_table(path))
    assert str(error.value) == beyond_message(
        "y",
        1,
        "2.5e+300",
        "series 'a' at row 3 (line 5 of the file), time 2024-01-04 00:00:00",
        300,
    )


def test_values_at_float32s_limits_are_kept():
    table = daily_pair()
    table.loc[[2, 3], "y"] = [FLOAT32_MAX, -FLOAT32_MAX]
    clean = validate_table(table, SPEC, HISTORY, HORIZON)
    assert clean["y"].iloc[[2, 3]].tolist() == [FLOAT32_MAX, -FLOAT32_MAX]


# ------------------------------------------------------------ boolean targets and inputs

BOOLEAN_TARGET = (
    "the target 'y' holds booleans: read as 0/1 numbers; quantile forecasts of a yes/no "
    "target may lie outside [0, 1]"
)


def boolean_target(dtype: str) -> pd.DataFrame:
    """`daily_pair` with a yes/no target of `dtype`, its object form with an empty cell."""
    table = daily_pair()
    table["y"] = (table["y"] % 3 == 0).astype(dtype)
    if dtype != "bool":
        table.loc[7, "y"] = pd.NA if dtype == "boolean" else np.nan
    return table


@pytest.mark.parametrize("dtype", ["bool", "boolean", "object"])
def test_a_boolean_target_is_announced_and_read_as_zero_one(dtype):
    # It was read as 0/1 silently, and forecast with quantiles outside [0, 1].
    table = boolean_target(dtype)
    messages = user_warnings(lambda: prepare(table))
    assert messages.count(BOOLEAN_TARGET) == 1, messages
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        clean = validate_table(table, SPEC, HISTORY, HORIZON)
    expected = (daily_pair()["y"] % 3 == 0).astype(float)
    if dtype != "bool":
        expected[7] = np.nan
    np.testing.assert_array_equal(clean["y"].to_numpy(), expected.to_numpy())


def test_a_boolean_target_read_from_a_csv_file_is_announced(tmp_path):
    path = tmp_path / "yes_no.csv"
    boolean_target("object").to_csv(path, index=False)  # 'True', '', 'False'
    messages = user_warnings(lambda: prepare(read_table(path)))
    assert BOOLEAN_TARGET in messages


def test_a_boolean_input_is_read_silently():
    # 0/1 inputs (a promotion on or off) are ordinary.
    table = daily_pair().assign(promo=lambda t: t["y"] % 2 == 0)
    messages = user_warnings(lambda: prepare(table, known_cols=["promo"]))
    assert not any("booleans" in message for message in messages), messages


def test_a_boolean_target_is_not_told_again_at_predict():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # told at fit
        fitted = prepare(boolean_target("bool")).preprocessor
    history = boolean_target("bool")
    messages = user_warnings(lambda: future_windows(fitted, history, None, HISTORY, HORIZON))
    assert not any("booleans" in message for message in messages), messages


@pytest.mark.parametrize("compress", [False, True])
def test_text_holding_ustar_where_a_tar_header_has_its_magic_is_read_as_csv(tmp_path, compress):
    # 'custard' with its 'ustar' at offset 257 was refused as a tar archive.
    head = "product,y\n"
    filler = "x" * (257 - len(head) - 1)
    text = head + filler + "c" + "ustard,1\n" + "".join(f"custard,{i}\n" for i in range(30))
    assert text.encode()[257:262] == b"ustar"
    path = tmp_path / ("sales.csv.gz" if compress else "sales.csv")
    path.write_bytes(gzip.compress(text.encode()) if compress else text.encode())
    table = read_table(path)
    assert len(table) == 31 and table["product"].iloc[1] == "custard"
