"""Every number `evaluate`, `backtest` and the run plots report is recomputed in float64
NumPy from the raw table and from `Forecaster.predict` called on the history before each
forecast origin (so no window can have read a later step).

The table: three daily stores with the settings of `tests/test_forecaster.py` (its compiled
steps are shared through the persistent cache), of different lengths (beta starts 20 days
late), one 10,000 times larger than the others (gamma), and one with two missing targets in
the test period (alpha).
"""

from __future__ import annotations

import tracemalloc
import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax import plots
from tft_jax.evaluation import to_batch
from tft_jax.forecaster import Forecaster, ModelConfig

from .cli_tables import HISTORY, HORIZON, TINY_TRAINING
from .figure_capture import _capture_figures
from .forecaster_stores import DATA

LEVELS = np.array([0.1, 0.5, 0.9])
COLUMNS = ["q0.1", "q0.5", "q0.9"]
MISSING_DAYS = pd.to_datetime(["2024-04-03", "2024-04-04"])


def stores() -> pd.DataFrame:
    """The long table (times as Timestamps, 'sales' NaN on alpha's missing days)."""
    rng = np.random.default_rng(3)
    frames = []
    for code, (store, first, level) in enumerate(
        (("alpha", "2024-01-01", 1.0), ("beta", "2024-01-21", 1.0), ("gamma", "2024-01-01", 1e4))
    ):
        days = pd.date_range(first, "2024-04-09", freq="D")
        promo = (rng.random(days.size) < 0.2).astype(float)
        weekend = (days.day_of_week >= 5).astype(float)
        noise = rng.normal(scale=0.5, size=days.size)
        sales = level * (10 + 3 * code + 2 * weekend + 4 * promo + noise)
        frames.append(
            pd.DataFrame(
                {
                    "store": store,
                    "day": days,
                    "sales": sales,
                    "size": 1.0 + code,
                    "promo": promo,
                    "temperature": rng.normal(size=days.size),
                }
            )
        )
    table = pd.concat(frames, ignore_index=True)
    table.loc[(table["store"] == "alpha") & table["day"].isin(MISSING_DAYS), "sales"] = np.nan
    return table


@pytest.fixture(scope="module")
def fitted():
    """`(forecaster, table, reference)`; `reference(cutoff)` is `predict` on the rows before
    `cutoff` (memoised), the forecast of every series for the H days from `cutoff`."""
    table = stores()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # alpha's missing targets, announced
        forecaster = Forecaster(DATA, ModelConfig(hidden_dim=8, num_heads=2), TINY_TRAINING)
        forecaster.fit(table, quiet=True)
    made: dict[pd.Timestamp, pd.DataFrame] = {}

    def reference(cutoff: pd.Timestamp) -> pd.DataFrame:
        if cutoff not in made:
            days = pd.date_range(cutoff, periods=HORIZON, freq="D")
            future = table[table["day"].isin(days)][["store", "day", "promo"]]
            made[cutoff] = forecaster.predict(table[table["day"] < cutoff], future)
        return made[cutoff]

    return forecaster, table, reference


def windows_from(table: pd.DataFrame, reference, cutoffs) -> list[dict]:
    """Every (cutoff, store) with `HISTORY` days before it and `HORIZON` observed days from it:
    its raw history, actuals and `predict`'s forecast `(H, Q)`."""
    found = []
    for cutoff in cutoffs:
        days = pd.date_range(cutoff, periods=HORIZON, freq="D")
        forecast = reference(cutoff)
        for store, rows in table.groupby("store"):
            series = rows.set_index("day")["sales"]
            history = series[series.index < cutoff].to_numpy()
            actual = series.reindex(days).to_numpy()
            if history.size < HISTORY or np.isnan(actual).any():
                continue
            mine = forecast[forecast["store"] == store]
            np.testing.assert_array_equal(pd.DatetimeIndex(mine["day"]), days)
            found.append(
                {
                    "cutoff": cutoff,
                    "store": store,
                    "history": history[-HISTORY:],
                    "actual": actual,
                    "forecast": mine[COLUMNS].to_numpy(np.float64),
                }
            )
    return found


def scores(forecasts: list[np.ndarray], actuals: list[np.ndarray]) -> dict:
    """The paper's q-risk per level, `2 Σ QL_q / Σ |y|`, and the mean pinball loss."""
    actual = np.stack(actuals)  # (N, H)
    forecast = np.stack(forecasts)
    if forecast.ndim == 2:  # a point forecast predicts every level
        forecast = np.repeat(forecast[..., None], LEVELS.size, axis=-1)
    error = actual[..., None] - forecast
    loss = np.maximum(LEVELS * error, (LEVELS - 1) * error)
    risk = 2 * loss.sum(axis=(0, 1)) / np.abs(actual).sum()
    return {"q_risk": risk, "mean_quantile_loss": loss.mean()}


def hand_baselines(history: np.ndarray) -> dict[str, np.ndarray]:
    """Seasonal naive and seasonal naive with drift (the mean seasonal difference) at the
    daily candidate periods that fit 14 days, 1 and 7, and the empirical quantiles of the
    last 7 days (`(H, Q)`: the ceil(q · 7)-th smallest, the 1st, 4th and 7th, every step)."""
    steps = np.arange(HORIZON)
    out = {}
    for period in (1, 7):
        naive = history[HISTORY - period + steps % period]
        drift = np.mean(history[period:] - history[:-period])
        out[f"seasonal_naive_{period}"] = naive
        out[f"drift_{period}"] = naive + (steps // period + 1) * drift
    out["empirical_7"] = np.tile(np.sort(history[-7:])[[0, 3, 6]], (HORIZON, 1))
    return out


def test_evaluate_scores_exactly_the_test_windows_from_forecasts_made_at_their_origin(fitted):
    forecaster, table, reference = fitted
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        test_start = forecaster.prepare(table, "test").test_start
        metrics = forecaster.evaluate(table, split="test")
    last = table["day"].max()
    cutoffs = pd.date_range(test_start, last - pd.Timedelta(days=HORIZON - 1), freq="D")
    found = windows_from(table, reference, cutoffs)
    # alpha's windows over its missing days are left out whole, the others all scored
    assert (
        metrics["windows"]
        == len(found)
        == 3 * len(cutoffs)
        - sum(1 for c in cutoffs if MISSING_DAYS.isin(pd.date_range(c, periods=HORIZON)).any())
    )
    actual = [w["actual"] for w in found]
    fp32 = scores([w["forecast"] for w in found], actual)
    model = metrics["models"]["fp32"]
    np.testing.assert_allclose(
        [model["q_risk"][k] for k in ("0.1", "0.5", "0.9")], fp32["q_risk"], rtol=2e-5
    )
    np.testing.assert_allclose(model["p50_q_risk"], fp32["q_risk"][1], rtol=2e-5)
    np.testing.assert_allclose(model["p90_q_risk"], fp32["q_risk"][2], rtol=2e-5)
    np.testing.assert_allclose(model["mean_quantile_loss"], fp32["mean_quantile_loss"], rtol=2e-5)

    assert metrics["seasonal_naive_period"] == 7
    by_name: dict[str, list[np.ndarray]] = {}
    for window in found:
        for name, forecast in hand_baselines(window["history"]).items():
            by_name.setdefault(name, []).append(forecast)
    assert set(metrics["baselines"]) == set(by_name)
    p50 = {}
    for name, forecasts in by_name.items():
        expected = scores(forecasts, actual)
        p50[name] = expected["q_risk"][1]
        got = metrics["baselines"][name]
        np.testing.assert_allclose(
            [got["p50_q_risk"], got["p90_q_risk"]], expected["q_risk"][1:], rtol=1e-12
        )
    best = min(p50, key=p50.__getitem__)
    models = metrics["models"]
    assert models["best_baseline"]["name"] == best
    assert models["seasonal_naive"]["p50_q_risk"] == pytest.approx(p50["seasonal_naive_7"])
    comparison = metrics["comparison"]
    np.testing.assert_allclose(
        comparison["fp32_vs_best_baseline_p50_q_risk_relative"],
        (fp32["q_risk"][1] - p50[best]) / p50[best],
        rtol=1e-4,
    )
    np.testing.assert_allclose(
        comparison["fp32_vs_seasonal_naive_p50_q_risk_relative"],
        (fp32["q_risk"][1] - p50["seasonal_naive_7"]) / p50["seasonal_naive_7"],
        rtol=1e-4,
    )


def test_backtest_cutoffs_end_at_the_data_and_score_forecasts_made_before_them(fitted):
    forecaster, table, reference = fitted
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        result = forecaster.backtest(table, n_windows=3, step=4)
    assert list(result.columns) == [
        "cutoff", "model", "baseline", "windows", "p50_q_risk", "p90_q_risk",
        "mean_quantile_loss",
    ]  # fmt: skip
    last_cutoff = table["day"].max() - pd.Timedelta(days=HORIZON - 1)  # the final H days
    cutoffs = [last_cutoff - pd.Timedelta(days=4 * k) for k in (2, 1, 0)]
    assert list(pd.unique(result["cutoff"])) == cutoffs
    for cutoff in cutoffs:
        found = windows_from(table, reference, [cutoff])
        rows = result[result["cutoff"] == cutoff].set_index("model")
        assert list(rows.index) == ["seasonal_naive", "best_baseline", "fp32"]
        assert (rows["windows"] == len(found)).all()
        actual = [w["actual"] for w in found]
        fp32 = scores([w["forecast"] for w in found], actual)
        got = rows.loc["fp32", ["p50_q_risk", "p90_q_risk"]].to_numpy(np.float64)
        np.testing.assert_allclose(got, fp32["q_risk"][1:], rtol=2e-5)
        np.testing.assert_allclose(
            rows.loc["fp32", "mean_quantile_loss"], fp32["mean_quantile_loss"], rtol=2e-5
        )
        naive = scores([hand_baselines(w["history"])["seasonal_naive_7"] for w in found], actual)
        np.testing.assert_allclose(
            rows.loc["seasonal_naive", "p50_q_risk"], naive["q_risk"][1], rtol=1e-12
        )
        # The baseline chosen at this cutoff (the table named none) and its score.
        p50 = {
            name: scores([hand_baselines(w["history"])[name] for w in found], actual)["q_risk"][1]
            for name in hand_baselines(found[0]["history"])
        }
        best = min(p50, key=p50.__getitem__)
        assert rows.loc["best_baseline", "baseline"] == best
        np.testing.assert_allclose(rows.loc["best_baseline", "p50_q_risk"], p50[best], rtol=1e-12)
        assert rows.loc[["seasonal_naive", "fp32"], "baseline"].isna().all()
    # alpha's missing days lie in the horizons of the last two cutoffs only
    assert result.groupby("cutoff")["windows"].first().tolist() == [3, 2, 2]


def test_backtest_refuses_too_many_cutoffs_before_listing_them(fitted):
    # The cutoff positions were listed before the check: n_windows=10**9 ran for minutes
    # and out of memory before this error. 3 million of them took over 100 MB.
    forecaster, table, _ = fitted
    tracemalloc.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            with pytest.raises(ValueError, match=r"3000000 cutoffs 1 steps apart need 3000020 "):
                forecaster.backtest(table, n_windows=3_000_000, step=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40e6


def test_run_plots_draw_the_forecasts_attention_and_weights_the_model_gives(
    fitted, tmp_path, monkeypatch
):
    forecaster, table, reference = fitted
    figures = _capture_figures(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dataset = forecaster.prepare(table, "test")
    windows = dataset.split("test")
    predictions = forecaster.predictions(dataset, windows)
    plots.draw_run_plots(
        dataset, "test", predictions, (0.1, 0.5, 0.9), None, tmp_path,
        postprocess=forecaster.postprocess,
    )  # fmt: skip
    fans, attention, importance = figures
    for axis in fans.axes:
        store = axis.get_title(loc="left")
        assert axis.get_ylabel() == "sales"
        actual, *medians = axis.get_lines()
        series = table[table["store"] == store].set_index("day")["sales"]
        drawn = pd.DatetimeIndex(actual.get_xdata())
        np.testing.assert_array_equal(actual.get_ydata(), series.reindex(drawn).to_numpy())
        assert len(medians) == len(axis.collections) >= 1
        for median, band in zip(medians, axis.collections, strict=True):
            days = pd.DatetimeIndex(median.get_xdata())
            forecast = reference(days[0])
            mine = forecast[forecast["store"] == store]
            np.testing.assert_array_equal(pd.DatetimeIndex(mine["day"]), days)
            np.testing.assert_allclose(median.get_ydata(), mine["q0.5"], rtol=1e-5)
            edges = band.get_paths()[0].vertices[:, 1]
            np.testing.assert_allclose(
                [edges.min(), edges.max()], [mine["q0.1"].min(), mine["q0.9"].max()], rtol=1e-5
            )

    # The model's own outputs over every test window, in one padded batch of the eval size.
    count = len(windows)
    indices = np.resize(np.arange(count), forecaster.config.training.eval_batch_size)
    assert count <= indices.size
    output = forecaster.predictor("fp32")(to_batch(windows.take(indices)))
    raw = {
        name: np.asarray(getattr(output, name), dtype=np.float64)[:count]
        for name in ("attention", "static_weights", "history_weights", "future_weights")
    }
    assert raw["attention"].shape[1] == 2  # heads: averaged too
    history_attention = raw["attention"][..., :HISTORY]  # (N, heads, H, T)
    *curves, mean = attention.axes[0].get_lines()
    np.testing.assert_array_equal(mean.get_xdata(), np.arange(-HISTORY, 0))
    np.testing.assert_allclose(mean.get_ydata(), history_attention.mean(axis=(0, 1, 2)), rtol=1e-5)
    first = curves[0]
    assert first.get_label() == "horizon 1"
    np.testing.assert_allclose(
        first.get_ydata(), history_attention[:, :, 0].mean(axis=(0, 1)), rtol=1e-5
    )

    expected = {
        "static inputs": (dataset.static_weight_names, raw["static_weights"].mean(axis=0)),
        "history inputs": (dataset.history_weight_names, raw["history_weights"].mean(axis=(0, 1))),
        "future inputs": (dataset.future_weight_names, raw["future_weights"].mean(axis=(0, 1))),
    }
    for axis in importance.axes:
        names, weights = expected[axis.get_title(loc="left")]
        labels = [label.get_text() for label in axis.get_yticklabels()]
        widths = [bar.get_width() for bar in axis.patches]
        by_name = dict(zip(names, weights, strict=True))
        np.testing.assert_allclose(widths, [by_name[label] for label in labels], rtol=1e-5)
        assert widths == sorted(widths)


def test_future_chart_draws_predict_after_the_last_tail_days_of_history(
    fitted, tmp_path, monkeypatch
):
    _, table, reference = fitted
    cutoff = table["day"].max() - pd.Timedelta(days=HORIZON - 1)
    history = table[table["day"] < cutoff]
    forecast = reference(cutoff)
    figures = _capture_figures(monkeypatch)
    plots.plot_future(
        tmp_path / "future.png", forecast, history, id_col="store", time_col="day",
        target="sales", quantiles=(0.1, 0.5, 0.9), tail=10,
    )  # fmt: skip
    (figure,) = figures
    assert [axis.get_title(loc="left") for axis in figure.axes] == ["alpha", "beta", "gamma"]
    for axis in figure.axes:
        store = axis.get_title(loc="left")
        assert axis.get_ylabel() == "sales"
        actual, median = axis.get_lines()
        past = history[history["store"] == store].tail(10)
        drawn = pd.DatetimeIndex(actual.get_xdata())
        np.testing.assert_array_equal(drawn[:10], pd.DatetimeIndex(past["day"]))
        np.testing.assert_array_equal(actual.get_ydata()[:10], past["sales"].to_numpy())
        mine = forecast[forecast["store"] == store]
        np.testing.assert_array_equal(pd.DatetimeIndex(median.get_xdata()), mine["day"])
        np.testing.assert_array_equal(median.get_ydata(), mine["q0.5"].to_numpy())
