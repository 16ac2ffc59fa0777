"""Real-world tables: encodings, day-first dates, missing-value texts, frequency mismatches,
sparse and short series, date splits and categorical columns, each reported by name."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset, tables

SPEC = dict(id_col="id", time_col="time", target="y", freq="h", history=6, horizon=3)


def hourly(lengths: dict[str, int], seed: int = 0, start: str = "2021-03-01") -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "id": series,
                    "time": pd.date_range(start, periods=n, freq="h"),
                    "y": 10.0 + rng.normal(size=n),
                    "region": "north" if k % 2 == 0 else "south",
                }
            )
            for k, (series, n) in enumerate(lengths.items())
        ],
        ignore_index=True,
    )


def test_a_file_in_another_encoding_is_named_with_the_option_to_read_it(tmp_path):
    table = hourly({"Zürich": 40})
    path = tmp_path / "latin.csv"
    table.to_csv(path, index=False, encoding="latin-1")
    with pytest.raises(ValueError, match=r"latin.csv is not utf-8 text .*encoding='latin-1'"):
        prepare_dataset(path, **SPEC)
    # The byte's place in the file (pandas' own offset counted from its chunk's start).
    data = path.read_bytes()
    offset = data.index("ü".encode("latin-1"))
    line = data[:offset].count(b"\n") + 1
    assert line > 1
    with pytest.raises(ValueError, match=rf"\(byte 0xfc at offset {offset}, line {line}\)"):
        prepare_dataset(path, **SPEC)
    dataset = prepare_dataset(path, **SPEC, encoding="latin-1")
    assert dataset.series_ids == ("Zürich",)


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig"])
def test_an_undecodable_byte_is_placed_in_the_file_across_decoding_chunks(
    tmp_path, monkeypatch, encoding
):
    # A byte-order mark made utf-8-sig's offset 3 short (and named another byte).
    monkeypatch.setattr(tables, "_DECODE_CHUNK", 5)  # chunks that end inside characters
    mark = b"\xef\xbb\xbf" if encoding == "utf-8-sig" else b""
    head = mark + "series,time,y\nZürich,2024-01-01 00:00,1\n".encode()
    path = tmp_path / "bad.csv"
    path.write_bytes(head + b"Z\xfcrich,2024-01-01 01:00,2\n")
    offset = len(head) + 1  # independent: the bytes written before it
    with pytest.raises(ValueError, match=rf"\(byte 0xfc at offset {offset}, line 3\)"):
        prepare_dataset(path, **SPEC, encoding=encoding)


def test_day_first_dates_get_a_hint_and_parse_with_dayfirst():
    table = hourly({"a": 60}).assign(
        time=lambda t: t["time"].dt.strftime("%d/%m/%Y %H:%M")
    )  # 01/03/2021 .. 03/03/2021: ambiguous, then 13+ hours later unambiguous days
    table = pd.concat([table, hourly({"b": 400}).assign(
        time=lambda t: t["time"].dt.strftime("%d/%m/%Y %H:%M"))], ignore_index=True)  # fmt: skip
    with pytest.raises(ValueError, match=r"day/month/year: pass dayfirst=True \(--dayfirst\)"):
        prepare_dataset(table, **SPEC)
    dataset = prepare_dataset(table, **SPEC, dayfirst=True)
    assert dataset.frame["time"].min() == pd.Timestamp("2021-03-01")
    assert dataset.frame["time"].max() == pd.Timestamp("2021-03-01") + pd.Timedelta(hours=399)
    explicit = prepare_dataset(table, **SPEC, time_format="%d/%m/%Y %H:%M")
    pd.testing.assert_series_equal(explicit.frame["time"], dataset.frame["time"])


def test_missing_value_texts_are_counted_and_announced():
    table = hourly({"a": 60}).astype({"y": object})
    table.loc[[10, 11], "y"] = ["n/a", " NULL "]
    # Two announcements: the texts read as missing, then the target steps they left filled.
    with (
        pytest.warns(
            UserWarning, match=r"^filled 2 missing target steps .* in 1 of 1 series: 'a' 2; "
        ),
        pytest.warns(UserWarning, match=r"missing-value text as missing: 2 in 'y'"),
    ):
        dataset = prepare_dataset(table, **SPEC)
    assert dataset.missing_texts == {"y": 2}
    report = dataset.missing_report()
    assert report.loc[0, "filled_target_steps"] == 2
    # Windows whose horizon holds row 10 or 11: starts 8..11.
    assert report.loc[0, "windows_left_out"] == 4


def test_a_too_fine_frequency_is_reported_with_the_recorded_one():
    table = hourly({"a": 60}).assign(time=lambda t: pd.date_range("2021-03-01", periods=60,
                                                                  freq="30min"))  # fmt: skip
    with pytest.raises(ValueError, match=r"freq='15min' leaves 50% .* every 30min"):
        prepare_dataset(table, **{**SPEC, "freq": "15min"})


def test_too_sparse_series_are_refused_by_name():
    table = hourly({"a": 60, "b": 60})
    sparse = table[(table["id"] == "a") | (table.index % 3 == 0) | (table["time"] >= "2021-03-03")]
    with pytest.raises(ValueError, match=r"1 series have more than 50% .*'b' \(53%\)"):
        prepare_dataset(sparse, **SPEC)
    with pytest.warns(UserWarning, match=r"filled 32 missing target steps"):
        prepare_dataset(sparse, **SPEC, max_missing_fraction=0.7)


def test_short_series_are_all_listed_and_left_out():
    table = hourly({"a": 60, "b": 5, "c": 7})
    with pytest.warns(UserWarning, match=r"left out 2 of 3 series .*'b' \(5 steps\), 'c' \(7"):
        dataset = prepare_dataset(table, **SPEC)
    assert dataset.series_ids == ("a",)
    with pytest.raises(ValueError, match=r"every series \(2\) is shorter .*'b'.*'c'"):
        prepare_dataset(table[table["id"] != "a"], **SPEC)
    with pytest.warns(
        UserWarning,
        match=r"left out 1 of 2 series shorter than 50 steps \(min_series_length=50\): "
        r"'c' \(40 steps\)",
    ):
        dataset = prepare_dataset(hourly({"a": 60, "c": 40}), **SPEC, min_series_length=50)
    assert dataset.series_ids == ("a",)


def test_a_date_split_puts_exactly_the_right_windows_in_each_part():
    table = hourly({"a": 60, "b": 50})
    cuts = {"validation_start": "2021-03-02 12:00", "test_start": "2021-03-02 20:00"}
    dataset = prepare_dataset(table, **SPEC, **cuts)
    validation, test = pd.Timestamp(cuts["validation_start"]), pd.Timestamp(cuts["test_start"])
    expected = {"train": [], "validation": [], "test": []}
    for series, n in (("a", 60), ("b", 50)):
        times = pd.date_range("2021-03-01", periods=n, freq="h")
        for first in range(6, n - 3 + 1):  # history 6, horizon 3
            start, last = times[first], times[first + 2]
            part = (
                "train" if last < validation
                else "validation" if start >= validation and last < test
                else "test" if start >= test else None
            )  # fmt: skip
            if part:
                expected[part].append((series, start))
    for part, wanted in expected.items():
        windows = dataset.split(part)
        got = [(dataset.series_ids[c], t) for c, t in
               zip(windows.series_code, windows.forecast_start, strict=True)]  # fmt: skip
        assert got == wanted, part
    with pytest.raises(ValueError, match=r"test_start 2021-04-01 00:00:00 <= the end of the data"):
        prepare_dataset(table, **SPEC, validation_start="2021-03-02", test_start="2021-04-01")


def test_text_columns_are_categorical_with_an_unknown_code_for_new_values():
    table = hourly({"a": 40, "b": 40, "c": 40})
    dataset = prepare_dataset(table, **SPEC, static_cols=["region"])
    assert dataset.static_feature_names == ()
    assert dataset.static_categorical_names == ("id", "region")
    assert dataset.static_categorical_cardinalities == (4, 3)  # a, b, c + unknown; 2 + unknown
    codes = dataset.train.arrays()["static_categorical"]
    regions = [dataset.series_ids[c] for c in dataset.train.series_code]
    np.testing.assert_array_equal(codes[:, 1], [0 if r in ("a", "c") else 1 for r in regions])
    renamed = table.assign(region=table["region"].replace({"south": "east"}))
    with (
        pytest.warns(UserWarning, match=r"'region' has values not seen in training.*'east'"),
        pytest.warns(UserWarning, match=r"series 'b' column 'region': trained 'south', given"),
    ):
        again = prepare_dataset(renamed, **SPEC, static_cols=["region"],
                                preprocessor=dataset.preprocessor)  # fmt: skip
    codes = again.train.arrays()["static_categorical"]
    assert set(codes[:, 1]) == {0, 2}  # north, unknown


def test_integer_codes_become_categorical_when_listed_and_mixed_text_is_an_error():
    table = hourly({"a": 40, "b": 40}).assign(store_type=lambda t: (t["id"] == "b") * 7)
    dataset = prepare_dataset(table, **SPEC, static_cols=["store_type"],
                              categorical_cols=["store_type"])  # fmt: skip
    assert dataset.preprocessor.vocabularies["store_type"] == (0, 7)
    mixed = table.assign(level=["3"] * 79 + ["high"])
    with pytest.raises(ValueError, match=r"'level' has 1 non-numeric values.*--categorical-cols"):
        prepare_dataset(mixed, **SPEC, observed_cols=["level"])


def test_a_missing_looking_text_in_a_text_column_is_a_category():
    table = hourly({"a": 40, "b": 40}).assign(
        holiday=lambda t: np.where(t.index % 24 == 0, "xmas", "none")
    )
    dataset = prepare_dataset(table, **SPEC, known_cols=["holiday"])
    assert dataset.missing_texts == {}
    assert dataset.preprocessor.vocabularies["holiday"] == ("none", "xmas")


def test_a_frequency_that_does_not_step_forward_is_refused_by_name():
    # pandas reads '0h' and '-1h'; a zero step failed deep in date_range and a
    # negative one called every timestamp "off the grid".
    for freq in ("0h", "-1h", "-1MS"):
        with pytest.raises(ValueError, match=rf"freq='{freq}' is a step of -?\d units; the "
                           "frequency must step forward"):  # fmt: skip
            prepare_dataset(hourly({"a": 40}), **{**SPEC, "freq": freq})


def test_ids_equal_as_text_but_of_two_types_are_refused():
    # A CSV-read table (ids 7) concatenated with rows whose ids are text ('7') would
    # otherwise split series 7 into two series, each with part of its rows.
    table = hourly({"a": 60}).assign(id=7).astype({"id": object})
    table.loc[table.index[:20], "id"] = "7"
    with pytest.raises(ValueError, match=r"id column 'id' holds '7' \(str\) and 7 \(int\): the "
                       r"same id as different types.*df\['id'\]\.astype\(str\)"):  # fmt: skip
        prepare_dataset(table, **SPEC)


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        # Zero-padded codes: pandas read '001' as store 1 and '01' with it.
        (("001", "01", "010"), ("001", "01", "010")),
        # Two texts of one number were one series.
        (("7", "7.0"), ("7", "7.0")),
        # Ids that read as numbers unchanged stay numbers, as before.
        (("101", "202"), (101, 202)),
    ],
)
def test_csv_series_ids_stay_what_the_file_says(tmp_path, ids, expected):
    table = hourly({name: 40 for name in ids})
    path = tmp_path / "ids.csv"
    table.to_csv(path, index=False)
    dataset = prepare_dataset(path, **SPEC)
    assert sorted(map(str, dataset.series_ids)) == sorted(map(str, expected))
    assert set(dataset.series_ids) == set(expected)
    assert len(dataset.series_ids) == len(ids)
