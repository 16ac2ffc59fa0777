"""The empirical-quantile baseline (`baselines.empirical_quantiles`) against hand computations
and an exact brute-force pinball-loss minimiser, the arguments it refuses, and its scores in
`evaluation.baseline_metrics` on tiny tables whose q-risks are worked out by hand."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from properties.suite import examples
from tft_jax.baselines import empirical_quantiles
from tft_jax.data import PreparedDataset, prepare_dataset
from tft_jax.evaluation import baseline_metrics, best_of

LEVELS = (0.1, 0.5, 0.9)


# ------------------------------------------------------------------ the forecasts themselves


def test_hand_computed_quantiles_of_an_intermittent_week():
    # Sorted last week [0, 0, 0, 0, 0, 5, 10], n = 7: ceil(0.7) = 1st, ceil(3.5) = 4th and
    # ceil(6.3) = 7th smallest. NumPy's default (linear) gives 7.0 at 0.9, between values.
    history = np.array([[3, 3, 0, 0, 0, 0, 5, 0, 10], [9, 9, 1, 2, 3, 4, 5, 6, 7]])
    forecast = empirical_quantiles(history, horizon=3, period=7, quantiles=LEVELS)
    expected = np.array([[0.0, 0.0, 10.0], [1.0, 4.0, 7.0]])
    assert forecast.shape == (2, 3, 3) and forecast.dtype == np.float64
    np.testing.assert_array_equal(forecast, np.repeat(expected[:, None, :], 3, axis=1))


def test_a_level_at_a_whole_rank_takes_the_lower_of_the_two_minimisers():
    # 10 values, q · n whole: q = 0.1 -> the 1st, 0.5 -> the 5th, 0.7 -> the 7th smallest.
    history = np.arange(1.0, 11.0)[::-1][None, :]  # 10, 9, ..., 1
    forecast = empirical_quantiles(history, 1, 10, (0.1, 0.5, 0.7, 0.2, 0.3, 0.6, 0.9))
    np.testing.assert_array_equal(forecast[0, 0], [1.0, 5.0, 7.0, 2.0, 3.0, 6.0, 9.0])
    # Just above a whole rank it is the next value.
    np.testing.assert_array_equal(empirical_quantiles(history, 1, 10, (0.5001,))[0, 0], [6.0])
    # In floats 0.28 · 25 = 7.000000000000001, 0.56 · 50 = 28.000000000000004 and
    # 0.58 · 50 = 28.999999999999996: the decimal's rank (7, 28, 29) counts.
    fifty = np.arange(50.0, 0.0, -1.0)[None, :]  # 50, 49, ..., 1
    np.testing.assert_array_equal(empirical_quantiles(fifty, 1, 25, (0.28,))[0, 0], [7.0])
    np.testing.assert_array_equal(
        empirical_quantiles(fifty, 1, 50, (0.14, 0.56, 0.58))[0, 0], [7.0, 28.0, 29.0]
    )


def test_the_columns_follow_the_levels_as_given_and_every_step_repeats_them():
    history = np.array([[4.0, -1.0, 7.0, 2.0, 0.5]])
    forecast = empirical_quantiles(history, horizon=6, period=5, quantiles=(0.9, 0.1, 0.5))
    assert forecast.shape == (1, 6, 3)
    np.testing.assert_array_equal(forecast[0], np.tile([7.0, -1.0, 2.0], (6, 1)))


def test_only_the_last_period_values_are_read():
    history = np.array([[1000.0, -1000.0, np.nan, 1.0, 2.0, 3.0]])
    forecast = empirical_quantiles(history, 2, 3, (0.1, 0.9))
    np.testing.assert_array_equal(forecast[0], [[1.0, 3.0], [1.0, 3.0]])


def test_integer_and_bool_histories_give_float64_forecasts():
    ints = empirical_quantiles(np.array([[0, 3, 1, 2]], dtype=np.int32), 2, 4, (0.5,))
    bools = empirical_quantiles(np.array([[True, False, False]]), 1, 3, (0.5, 0.9))
    assert ints.dtype == bools.dtype == np.float64
    np.testing.assert_array_equal(ints[0, :, 0], [1.0, 1.0])
    np.testing.assert_array_equal(bools[0, 0], [0.0, 1.0])


def _exact_minimiser(sample: np.ndarray, level: Fraction) -> int:
    """The smallest value of `sample` (ints) that minimises the exact pinball loss of `level`.

    The pinball loss over a sample is convex and piecewise linear with kinks at the sample
    values, so one of them minimises it; the smallest such is the inverted CDF's quantile.
    """
    values = [int(v) for v in sample]

    def loss(x: int) -> Fraction:
        return sum(
            (level * (y - x) if y >= x else (level - 1) * (y - x) for y in values), Fraction(0)
        )

    losses = {x: loss(x) for x in set(values)}
    least = min(losses.values())
    return min(x for x, value in losses.items() if value == least)


@settings(max_examples=examples(60), deadline=None)
@given(
    history=hnp.arrays(
        np.int64,
        st.tuples(st.integers(1, 3), st.integers(1, 25)),
        elements=st.integers(-4, 6),  # few distinct values: many ties
    ),
    hundredths=st.lists(st.integers(1, 99), min_size=1, max_size=5),
    data=st.data(),
)
def test_each_quantile_is_the_smallest_exact_pinball_minimiser_over_the_sample(
    history, hundredths, data
):
    period = data.draw(st.integers(1, history.shape[1]))
    horizon = data.draw(st.integers(1, 4))
    forecast = empirical_quantiles(history, horizon, period, [k / 100 for k in hundredths])
    assert forecast.shape == (history.shape[0], horizon, len(hundredths))
    for row in range(history.shape[0]):
        sample = history[row, -period:]
        expected = [_exact_minimiser(sample, Fraction(k, 100)) for k in hundredths]
        np.testing.assert_array_equal(forecast[row], np.tile(expected, (horizon, 1)))


def test_the_quantiles_minimise_the_float64_pinball_loss_over_real_samples():
    rng = np.random.default_rng(7)
    sample = np.round(rng.gamma(0.6, 20.0, size=28) * (rng.random(28) < 0.4), 1)  # intermittent
    levels = np.array([0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98])
    forecast = empirical_quantiles(sample[None, :], 1, 28, levels)[0, 0]
    grid = np.linspace(sample.min() - 1.0, sample.max() + 1.0, 4001)
    for level, value in zip(levels, forecast, strict=True):

        def loss(x, level=level):
            error = sample - x
            return np.maximum(level * error, (level - 1) * error).sum()

        assert value in sample
        assert loss(value) <= min(loss(x) for x in grid) + 1e-9


@pytest.mark.parametrize(
    ("history", "horizon", "period", "levels", "error", "match"),
    [
        (np.zeros(5), 2, 1, LEVELS, ValueError, r"history must have shape \(B, T\)"),
        (np.zeros((1, 5, 1)), 2, 1, LEVELS, ValueError, r"history must have shape \(B, T\)"),
        (np.array([["a", "b"]]), 1, 1, LEVELS, TypeError, "history must hold real numbers"),
        (np.ones((1, 3), complex), 1, 1, LEVELS, TypeError, "history must hold real numbers"),
        (np.zeros((1, 5)), 0, 1, LEVELS, ValueError, "horizon must be >= 1"),
        (np.zeros((1, 5)), 2.0, 1, LEVELS, TypeError, "horizon must be an int"),
        (np.zeros((1, 5)), 2, 0, LEVELS, ValueError, "period must be >= 1"),
        (np.zeros((1, 5)), 2, 1.5, LEVELS, TypeError, "period must be an int"),
        (np.zeros((1, 5)), 2, True, LEVELS, TypeError, "period must be an int"),
        (np.zeros((2, 5)), 2, 6, LEVELS, ValueError, r"period \(6\) .* longer than the history"),
        (np.zeros((1, 5)), 2, 2, (0.5, 1.0), ValueError, r"quantiles must be .* in \(0, 1\)"),
        (np.zeros((1, 5)), 2, 2, (0.0,), ValueError, r"quantiles must be .* in \(0, 1\)"),
        (np.zeros((1, 5)), 2, 2, (-0.1, 0.5), ValueError, r"quantiles must be .* in \(0, 1\)"),
        (np.zeros((1, 5)), 2, 2, (np.nan,), ValueError, r"quantiles must be .* in \(0, 1\)"),
        (np.zeros((1, 5)), 2, 2, (), ValueError, r"quantiles must be at least one level"),
        (np.zeros((1, 5)), 2, 2, "0.5", TypeError, "quantiles must be a sequence of numbers"),
        (np.zeros((1, 5)), 2, 2, None, TypeError, "quantiles must be a sequence of numbers"),
        (np.zeros((1, 5)), 2, 2, [[0.5]], TypeError, "quantiles must be a sequence of numbers"),
        (np.zeros((1, 5)), 2, 2, [True], TypeError, "quantiles must be a sequence of numbers"),
        (np.zeros((1, 5)), 2, 2, ["0.5"], TypeError, "quantiles must be a sequence of numbers"),
    ],
)
def test_bad_arguments_name_the_argument(history, horizon, period, levels, error, match):
    with pytest.raises(error, match=match):
        empirical_quantiles(history, horizon, period, levels)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_in_the_sample_is_refused_naming_where(bad):
    history = np.ones((3, 6))
    history[2, 4] = bad
    with pytest.raises(ValueError, match=r"1 NaN/inf values .* \(first: series 2, step 4\)"):
        empirical_quantiles(history, 2, 3, LEVELS)


# ------------------------------------------------------------------ scored by baseline_metrics


def weekly_dataset(week: list[float], weeks: int = 12) -> PreparedDataset:
    """One daily series repeating `week` exactly, history 14 and horizon 7: the last 7 history
    days of every window hold `week`'s values, and its 7 forecast days hold them too."""
    times = pd.date_range("2024-01-01", periods=7 * weeks, freq="D")
    table = pd.DataFrame({"shop": "a", "day": times, "sales": np.tile(week, weeks)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return prepare_dataset(
            table, id_col="shop", time_col="day", target="sales", freq="D", history=14,
            horizon=7, validation_fraction=0.2, test_fraction=0.2,
        )  # fmt: skip


def test_baseline_metrics_scores_empirical_quantiles_by_hand_on_an_intermittent_week():
    # The week {0 ×5, 5, 10}: forecasts P10 0, P50 0, P90 10 (sorted week, 1st, 4th, 7th).
    # Per window Σ|y| = 15; pinball: P10 0.1 · 15 = 1.5, P50 0.5 · 15 = 7.5, P90
    # 5 zeros · 0.1 · 10 + 0.1 · 5 + 0 = 5.5. q-risk = 2 Σ QL / Σ|y|, the same for every window.
    dataset = weekly_dataset([0.0, 0.0, 0.0, 0.0, 5.0, 0.0, 10.0])
    windows = dataset.test
    assert len(windows) > 1
    scores = baseline_metrics(dataset, windows, LEVELS, (1, 7))
    assert set(scores) == {
        "seasonal_naive_1", "drift_1", "seasonal_naive_7", "drift_7", "empirical_7"
    }  # fmt: skip
    empirical = scores["empirical_7"]
    assert empirical["q_risk"] == pytest.approx({"0.1": 0.2, "0.5": 1.0, "0.9": 11 / 15}, rel=1e-12)
    assert empirical["p50_q_risk"] == pytest.approx(1.0, rel=1e-12)
    assert empirical["p90_q_risk"] == pytest.approx(11 / 15, rel=1e-12)
    assert empirical["mean_quantile_loss"] == pytest.approx((1.5 + 7.5 + 5.5) / 21, rel=1e-12)
    assert empirical["mean_quantile_loss_scaled"] is not None
    # The week repeats exactly: seasonal naive (and a drift of 0) is perfect and stays best.
    assert scores["seasonal_naive_7"]["p50_q_risk"] == scores["drift_7"]["p50_q_risk"] == 0.0
    assert best_of(scores) == "drift_7"  # the tie goes to the name first in sorted order


def test_baseline_metrics_clips_the_empirical_quantiles_when_nonnegative():
    # The week {-3, -1, 0, 2, 5, 1, -2}, sorted [-3, -2, -1, 0, 1, 2, 5]: P10 -3 (0 clipped),
    # P50 0, P90 5; Σ|y| = 14 per window. P10 at -3: 0.1 · Σ(y + 3) = 2.3; clipped at 0:
    # 0.1 · 8 (above) + 0.9 · 6 (below) = 6.2. P50 at 0: 0.5 · 14 = 7. P90 at 5: 0.1 · 33 = 3.3.
    dataset = weekly_dataset([-3.0, -1.0, 0.0, 2.0, 5.0, 1.0, -2.0])
    windows = dataset.test
    raw = baseline_metrics(dataset, windows, LEVELS, (7,))["empirical_7"]
    clipped = baseline_metrics(dataset, windows, LEVELS, (7,), nonnegative=True)["empirical_7"]
    assert raw["q_risk"] == pytest.approx({"0.1": 4.6 / 14, "0.5": 1.0, "0.9": 6.6 / 14})
    assert clipped["q_risk"] == pytest.approx({"0.1": 12.4 / 14, "0.5": 1.0, "0.9": 6.6 / 14})


def test_baseline_metrics_scores_each_level_with_its_own_column():
    # Levels given out of order: each q-risk must still be that level's (a column mix-up
    # would score the 0.9 column as P10).
    dataset = weekly_dataset([0.0, 0.0, 0.0, 0.0, 5.0, 0.0, 10.0])
    scores = baseline_metrics(dataset, dataset.test, (0.9, 0.1, 0.5), (7,))["empirical_7"]
    assert scores["q_risk"] == pytest.approx({"0.9": 11 / 15, "0.1": 0.2, "0.5": 1.0})


def test_the_empirical_baseline_wins_where_the_last_season_misleads():
    # Intermittent sales whose weekly pattern is noise: the last week's values repeated
    # (seasonal naive) are worse at P50 than their quantiles. Reference: the q-risks from
    # the windows' own histories and actuals in float64, read from the table.
    rng = np.random.default_rng(11)
    sales = np.where(rng.random(7 * 16) < 0.3, rng.integers(1, 9, 7 * 16), 0).astype(float)
    times = pd.date_range("2024-01-01", periods=sales.size, freq="D")
    table = pd.DataFrame({"shop": "a", "day": times, "sales": sales})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dataset = prepare_dataset(
            table, id_col="shop", time_col="day", target="sales", freq="D", history=14,
            horizon=7, validation_fraction=0.2, test_fraction=0.3,
        )  # fmt: skip
    windows = dataset.test
    scores = baseline_metrics(dataset, windows, LEVELS, (7,))
    starts = [int(np.flatnonzero(times == t)[0]) for t in windows.forecast_start]
    levels = np.array(LEVELS)
    loss_sums, total = np.zeros(3), 0.0
    for start in starts:
        week = np.sort(sales[start - 7 : start])
        forecast = week[[0, 3, 6]]  # ceil(0.7), ceil(3.5), ceil(6.3): the 1st, 4th, 7th
        actual = sales[start : start + 7, None]
        error = actual - forecast
        loss_sums += np.maximum(levels * error, (levels - 1) * error).sum(axis=0)
        total += np.abs(actual).sum()
    expected = 2 * loss_sums / total
    got = scores["empirical_7"]
    np.testing.assert_allclose([got["q_risk"][k] for k in ("0.1", "0.5", "0.9")], expected)
    assert got["p50_q_risk"] < scores["seasonal_naive_7"]["p50_q_risk"]
