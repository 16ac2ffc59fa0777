"""`tft_jax.data.listing`: how messages quote long lists, and the values a list repeats."""

import pytest

from tft_jax.data.listing import first_few, repeated


def test_short_lists_are_shown_whole() -> None:
    assert first_few([]) == ""
    assert first_few(["'a'"]) == "'a'"
    assert first_few(["a", "b", "c", "d", "e"]) == "a, b, c, d, e"


def test_long_lists_count_what_is_left_out() -> None:
    texts = [f"s{i}" for i in range(12)]
    assert first_few(texts) == "s0, s1, s2, s3, s4 and 7 more"
    assert first_few(texts, limit=10, separator="; ") == (
        "s0; s1; s2; s3; s4; s5; s6; s7; s8; s9 and 2 more"
    )
    assert first_few(texts, limit=11) == "s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10 and 1 more"


def test_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit must be >= 1, got 0"):
        first_few(["a"], limit=0)


def test_repeated_lists_each_repeated_value_once_in_first_seen_order():
    assert repeated([3, 1, "1", 3, 2, 1, 3]) == [3, 1]  # 1 and '1' differ
    assert repeated(("b", "a", "a", "b")) == ["b", "a"]
    assert repeated([[1], [1], {"k": 0}]) == [[1]]  # unhashable values too
    assert repeated([]) == [] and repeated(["x", "y"]) == []
