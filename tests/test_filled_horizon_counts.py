"""Windows and steps counted apart under `require_observed_target=False`.

In `tests/test_filled_horizons.py` every masked window holds one filled step,
so a count of windows where steps were meant (or the reverse) went unseen
(mutation testing, round 7). Here windows hold up to three. Each test is
checked against an independent reference: a hand-made daily table whose
missing (series, day) targets are listed, counted per window with plain
Python over dates, or a NumPy recomputation.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from tests.cli_tables import HORIZON as STORE_H
from tests.cli_tables import TINY_TRAINING, write_table
from tests.forecaster_stores import DATA, MODEL
from tft_jax.data import prepare_dataset
from tft_jax.data.dataset import KEEP_FILLED_HORIZONS, keep_option_named
from tft_jax.data.tables import TableContentError
from tft_jax.evaluation import actuals, observed_steps
from tft_jax.forecaster import DataConfig, Forecaster

HISTORY, HORIZON = 4, 3
DAYS = 40
START = pd.Timestamp("2024-01-01")
# Missing targets: two adjacent days of 'a' (a window may hold both: 2 masked steps),
# three days of 'b' within one horizon, one day of 'c'; all after the first history.
MISSING = {
    ("a", START + pd.Timedelta(days=10)),
    ("a", START + pd.Timedelta(days=11)),
    ("b", START + pd.Timedelta(days=20)),
    ("b", START + pd.Timedelta(days=21)),
    ("b", START + pd.Timedelta(days=22)),
    ("c", START + pd.Timedelta(days=33)),
}
OPTIONS = dict(
    id_col="id", time_col="time", target="y", freq="D", history=HISTORY, horizon=HORIZON,
    validation_fraction=0.25, test_fraction=0.25,
)  # fmt: skip


def _table() -> pd.DataFrame:
    times = pd.date_range(START, periods=DAYS, freq="D")
    rng = np.random.default_rng(7)
    parts = [
        pd.DataFrame({"id": s, "time": times, "y": 50.0 + 10 * k + rng.uniform(0, 5, DAYS)})
        for k, s in enumerate("abc")
    ]
    table = pd.concat(parts, ignore_index=True)
    gone = [(s, t) in MISSING for s, t in zip(table["id"], table["time"], strict=True)]
    table.loc[gone, "y"] = np.nan  # empty cells (rows present)
    return table


def _prepare(table, **options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = prepare_dataset(table, **{**OPTIONS, **options})
    return dataset, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def _filled_in_horizon(dataset, windows) -> np.ndarray:
    """(N,) per window, how many of its HORIZON forecast days are in MISSING (by dates)."""
    return np.array(
        [
            sum((dataset.series_ids[code], day) in MISSING
                for day in pd.date_range(start, periods=HORIZON, freq="D"))
            for code, start in zip(windows.series_code, windows.forecast_start, strict=True)
        ]
    )  # fmt: skip


@pytest.fixture(scope="module")
def kept():
    return _prepare(_table(), require_observed_target=False)


def test_reference_table_has_windows_with_several_masked_steps(kept):
    dataset, _ = kept
    counts = np.concatenate([_filled_in_horizon(dataset, dataset.split(s))
                             for s in ("train", "validation", "test")])  # fmt: skip
    assert counts.max() >= 2 and (counts == 1).any()  # steps != windows


def test_summary_counts_masked_steps_not_windows(kept):
    # Kills D1 (masked_target_steps counted windows with a filled step, not steps).
    dataset, _ = kept
    summary = dataset.summary()["masked_target_steps"]
    for split in ("train", "validation", "test"):
        windows = dataset.split(split)
        expected = int(_filled_in_horizon(dataset, windows).sum())
        assert summary[split] == expected == int((~observed_steps(windows)).sum()), split


def test_missing_report_counts_masked_windows_and_steps_per_series(kept):
    # Kills D3 (masked_steps weighted by a bool, i.e. windows) and D2/D4 (windows_masked).
    dataset, _ = kept
    windows_masked = dict.fromkeys(dataset.series_ids, 0)
    masked_steps = dict.fromkeys(dataset.series_ids, 0)
    for split in ("train", "validation", "test"):
        windows = dataset.split(split)
        counts = _filled_in_horizon(dataset, windows)
        for code, count in zip(windows.series_code, counts, strict=True):
            series = dataset.series_ids[code]
            windows_masked[series] += int(count > 0)
            masked_steps[series] += int(count)
    report = dataset.missing_report()
    ids = list(dataset.series_ids)
    np.testing.assert_array_equal(report["windows_masked"], [windows_masked[s] for s in ids])
    np.testing.assert_array_equal(report["masked_steps"], [masked_steps[s] for s in ids])
    assert report["masked_steps"].sum() > report["windows_masked"].sum()


def test_the_announcement_counts_windows_and_steps_separately(kept):
    # Kills D13 / D16 (the warning's window count and step count swapped).
    dataset, messages = kept
    report = dataset.missing_report()
    windows, steps = int(report["windows_masked"].sum()), int(report["masked_steps"].sum())
    assert windows != steps
    expected = (
        f"the {windows} windows whose horizon holds one are kept, their {steps} filled "
        "forecast steps masked"
    )
    assert any(expected in message for message in messages), messages


def test_keep_option_named_is_undone_on_leaving_even_after_an_error():
    # Kills D12 (the context variable not reset: later prepare_dataset calls of the same
    # thread named another caller's option).
    table = _table()
    with pytest.raises(RuntimeError), keep_option_named("--my-flag"):
        raise RuntimeError("boom")
    with keep_option_named("Setting.X=False"):
        _, inside = _prepare(table)
    _, outside = _prepare(table)
    assert any("(Setting.X=False keeps the " in m for m in inside), inside
    assert any(f"({KEEP_FILLED_HORIZONS} keeps the " in m for m in outside), outside
    assert not any("Setting.X" in m or "--my-flag" in m for m in outside)


def test_actuals_nan_at_every_step_the_mask_leaves_out_even_an_observed_one(kept):
    # Kills E3 (`actuals` returned the table's values where `observed` is False: NaN only
    # at missing targets, an observed value at a step the caller left out).
    dataset, _ = kept
    windows = dataset.test
    observed = observed_steps(windows)
    mask = observed.copy()
    mask[np.argwhere(observed)[0][0], np.argwhere(observed)[0][1]] = False  # an observed one
    got = actuals(dataset, windows, mask)
    expected = dataset.frame["y"].to_numpy(np.float64)[windows.starts[:, None] + np.arange(HORIZON)]
    assert np.isnan(got[~mask]).all()
    np.testing.assert_array_equal(got[mask], expected[mask])


def test_a_split_not_scored_may_have_no_observed_step_when_a_fitted_model_reads_the_table():
    # Kills D5 (the "no forecast step has an observed target" check ran on every split,
    # not only those asked for: a fitted model scoring the test split was refused for a
    # blank validation period it never reads). Its windows, every step filled, are left out.
    table = _table()
    fitted, _ = _prepare(table, require_observed_target=False)
    days = pd.date_range(START + pd.Timedelta(days=20), periods=10, freq="D")  # validation
    blank = table.assign(y=table["y"].where(~table["time"].isin(days)))
    dataset, _ = _prepare(
        blank, require_observed_target=False, preprocessor=fitted.preprocessor, scored="test"
    )
    assert len(dataset.validation) == 0
    assert observed_steps(dataset.test).any(axis=1).all()
    with pytest.raises(ValueError, match=r"the validation period .* no forecast step of theirs"):
        _prepare(blank, require_observed_target=False)  # a fit wants every split


# ------------------------------------------------------------------ Forecaster (one tiny fit)


STORE_KEEP = DataConfig(**{**{f: getattr(DATA, f) for f in DATA.__dataclass_fields__},
                           "require_observed_target": False})  # fmt: skip
# Stores table (100 days from 2024-01-01, test from 2024-03-26): two adjacent missing days of
# alpha (a test window holds both), one of gamma.
STORE_MISSING = {("alpha", "2024-04-01"), ("alpha", "2024-04-02"), ("gamma", "2024-04-05")}


def _quiet(call, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return call(*args, **kwargs)


@pytest.fixture(scope="module")
def store_fit(tmp_path_factory):
    table = pd.read_csv(write_table(tmp_path_factory.mktemp("r7") / "stores.csv"))
    gone = [(s, d) in STORE_MISSING for s, d in zip(table["store"], table["day"], strict=True)]
    table.loc[gone, "sales"] = np.nan
    forecaster = _quiet(Forecaster(STORE_KEEP, MODEL, TINY_TRAINING).fit, table, quiet=True)
    return forecaster, table


def _store_masked(starts_by_store) -> int:
    """How many (window, step) of windows {(store, first day)} fall on a STORE_MISSING day."""
    return sum(
        (store, day.strftime("%Y-%m-%d")) in STORE_MISSING
        for store, start in starts_by_store
        for day in pd.date_range(start, periods=STORE_H, freq="D")
    )


def test_evaluate_counts_masked_steps_not_windows(store_fit):
    # Kills F2 (evaluate's masked_steps counted windows holding a filled step).
    forecaster, table = store_fit
    scores = _quiet(forecaster.evaluate, table)
    dataset = _quiet(forecaster.prepare, table, "test")
    windows = dataset.test
    starts = list(zip((dataset.series_ids[c] for c in windows.series_code),
                      windows.forecast_start, strict=True))  # fmt: skip
    expected = _store_masked(starts)
    touching = sum(_store_masked([s]) > 0 for s in starts)
    assert expected > touching  # a window holds two masked steps
    assert scores["windows"] == len(starts)
    assert scores["masked_steps"] == expected


def test_backtest_counts_masked_steps_not_windows_per_cutoff(store_fit):
    # Kills F8 (backtest's masked_steps counted windows holding a filled step).
    forecaster, table = store_fit
    result = _quiet(forecaster.backtest, table, n_windows=2, step=3)
    for cutoff, rows in result.groupby("cutoff"):
        expected = _store_masked([(s, cutoff) for s in ("alpha", "beta", "gamma")])
        assert (rows["masked_steps"] == expected).all(), cutoff
    first = result[result["cutoff"] == pd.Timestamp("2024-03-31")]
    assert (first["masked_steps"] == 3).all()  # alpha's two days and gamma's one


def test_backtest_a_zero_target_cutoff_with_a_masked_step_still_gives_the_mean_loss(store_fit):
    # Kills F7 (`_zero_target_metrics` scored the mean loss without the mask: the NaN
    # actual of the filled step made the whole backtest fail).
    forecaster, table = store_fit
    cutoff = pd.Timestamp("2024-04-03")  # the last cutoff; gamma's 2024-04-05 is missing
    days = pd.to_datetime(table["day"])
    zero = table.assign(sales=table["sales"].where(days < cutoff, table["sales"] * 0.0))
    result = _quiet(forecaster.backtest, zero, n_windows=2, step=3)  # 2024-03-31 scores
    rows = result[result["cutoff"] == cutoff].set_index("model")
    assert (rows["windows"] == 3).all() and (rows["masked_steps"] == 1).all()
    assert rows["p50_q_risk"].isna().all()
    assert np.isfinite(rows.loc["fp32", "mean_quantile_loss"])
    # The seasonal naive forecast (7 days) of a 0 actual: (1 - q) * f, over the observed steps.
    own = zero.assign(day=days).set_index(["store", "day"])["sales"]
    losses = []
    for store in ("alpha", "beta", "gamma"):
        for day in pd.date_range(cutoff, periods=STORE_H, freq="D"):
            if (store, day.strftime("%Y-%m-%d")) in STORE_MISSING:
                continue
            naive = own.loc[store].loc[: day - pd.Timedelta(days=7)].ffill().iloc[-1]
            losses += [(1 - q) * max(naive, 0.0) for q in (0.1, 0.5, 0.9)]
    expected = float(np.mean(losses))
    assert rows.loc["seasonal_naive", "mean_quantile_loss"] == pytest.approx(expected, rel=1e-9)


def test_backtest_with_no_scorable_cutoff_says_one_observed_step_would_do(store_fit):
    # Kills F9 (the message of a backtest scoring nothing demanded "an observed target over
    # the H steps", the default's rule, of a forecaster that scores one observed step).
    forecaster, table = store_fit
    days = sorted(table["day"].unique())
    blank = table.assign(sales=table["sales"].where(~table["day"].isin(days[-7:])))
    with pytest.raises(TableContentError, match=r"no cutoff scores a series") as caught:
        _quiet(forecaster.backtest, blank, n_windows=1)
    message = str(caught.value)
    assert f"and one observed target over the {STORE_H} steps after it" in message
    assert f"its target is missing at all {STORE_H} steps from it" in message


@pytest.mark.parametrize("observed_days", [1, 0])
def test_a_period_left_without_windows_names_how_many_have_an_observed_step(observed_days):
    # Kills D8 / D15 (every window counted as having an observed step) and D9 (a single
    # such window said to be none). Test period: days 30..39, windows starting 30..37;
    # every target there blank but, with observed_days=1, 'a' on day 30, which lies in
    # the horizon of one window only ('a' from day 30).
    table = _table()
    days = table["time"] >= START + pd.Timedelta(days=30)
    keep = (table["id"] == "a") & (table["time"] == START + pd.Timedelta(days=30))
    blank = table.assign(y=table["y"].where(~days | (keep if observed_days else False)))
    every = 3 * (37 - 30 + 1)  # three series, eight starts each
    with pytest.raises(ValueError, match=rf"its {every} windows all have a filled target") as e:
        _prepare(blank)
    message = str(e.value)
    if observed_days:
        assert "keep the 1 of them with an observed step" in message
        assert "and none an observed one" not in message
    else:
        assert "and none an observed one" in message
        assert "require_observed_target" not in message


def test_evaluate_names_a_split_whose_windows_the_history_screen_all_leaves_out(store_fit):
    # The windows left after those with too filled a history are screened out had no
    # observed step (a bare ValueError from the metrics); now no window without one is
    # kept, and the screen names what it leaves out.
    forecaster, table = store_fit
    days = pd.to_datetime(table["day"])
    day = lambda n: pd.Timestamp("2024-01-01") + pd.Timedelta(days=n)  # noqa: E731
    alpha = (table["store"] == "alpha") & (days >= day(60)) & (days < day(92))
    others = (table["store"] != "alpha") & (days >= day(85))
    blank = table.assign(sales=table["sales"].where(~(alpha | others)))
    with pytest.raises(
        TableContentError,
        match=r"evaluate: every one of the \d+ windows of the test split has more than 50% of "
        r"its 14 history steps filled",
    ):
        _quiet(forecaster.evaluate, blank)
