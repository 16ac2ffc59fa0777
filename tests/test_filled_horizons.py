"""Windows whose forecast horizon holds a missing (filled) target, kept with
`DataConfig.require_observed_target=False` (`--no-require-observed-target`).

By default such windows are left out of training, validation and scoring; a
few scattered missing steps then leave out most windows of a long horizon.
Kept, their filled steps (`target_mask` 0) must be left out of the loss and
of every score. Scores are checked against float64 NumPy and pandas
computations over the observed steps; the two tiny fits (the stores table of
`tests/forecaster_stores.py`, its model and training shapes) share their
compiled programs.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import warnings

import jax
import numpy as np
import optax
import pandas as pd
import pytest

from tests.linear_quantile_model import MODEL as LINEAR_MODEL
from tests.linear_quantile_model import QUANTILES as LINEAR_QUANTILES
from tests.linear_quantile_model import linear_batch
from tft_jax.cli import cli_text, metrics_table
from tft_jax.cli_parser import build_parser, forecaster_config
from tft_jax.data import prepare_dataset
from tft_jax.evaluation import (
    actuals,
    baseline_metrics,
    forecast_frame,
    forecast_metrics,
    mean_quantile_loss,
    observed_steps,
    to_original_units,
    write_forecasts,
)
from tft_jax.forecaster import DataConfig, Forecaster, RunFolderError, run_folder
from tft_jax.train import create_train_state, eval_step, train_step

from .cli_tables import HORIZON, TINY_TRAINING, write_table
from .forecaster_stores import DATA, MODEL, edited

LEVELS = (0.1, 0.5, 0.9)
KEEP = dataclasses.replace(DATA, require_observed_target=False)
# Missing targets of the stores table (100 days from 2024-01-01; validation from day 70,
# 2024-03-11, test from day 85, 2024-03-26): empty cells in the training and test periods,
# a row left out in the validation period.
BLANK = {("alpha", "2024-01-31"), ("alpha", "2024-03-29"), ("gamma", "2024-04-05")}
DROPPED = {("beta", "2024-03-15")}
MISSING = {(store, pd.Timestamp(day)) for store, day in BLANK | DROPPED}


def _pinball(actual: np.ndarray, forecast: np.ndarray, level: float) -> np.ndarray:
    error = actual - forecast
    return np.maximum(level * error, (level - 1.0) * error)


def _reference(forecast, actual, observed, scale=None, transform=lambda x: x):
    """Float64 q-risk per level, mean loss and scaled loss over the observed steps, by loops."""
    sums, absolute, scaled, count = np.zeros(len(LEVELS)), 0.0, 0.0, 0
    for window, step in zip(*np.nonzero(observed), strict=True):
        y = float(actual[window, step])
        absolute += abs(y)
        count += 1
        for index, level in enumerate(LEVELS):
            f = float(forecast[window, step, index])
            sums[index] += _pinball(np.float64(y), np.float64(f), level)
            if scale is not None:
                divisor = float(scale[window])
                scaled += _pinball(transform(y) / divisor, transform(f) / divisor, level)
    result = {
        "q_risk": {f"{q:g}": 2.0 * s / absolute for q, s in zip(LEVELS, sums, strict=True)},
        "mean_quantile_loss": sums.sum() / (count * len(LEVELS)),
    }
    if scale is not None:
        result["mean_quantile_loss_scaled"] = scaled / (count * len(LEVELS))
    return result


def _arrays(seed: int = 0):
    rng = np.random.default_rng(seed)
    actual = rng.uniform(1.0, 30.0, size=(5, 4))
    forecast = np.sort(np.abs(actual[..., None] + rng.normal(scale=4.0, size=(5, 4, 3))), axis=-1)
    observed = rng.random((5, 4)) > 0.3
    observed[0] = False  # a window with no observed step adds nothing
    return forecast, actual, observed, rng.uniform(0.5, 3.0, size=5)


@pytest.mark.parametrize("transform", ["none", "log1p"])
def test_masked_metrics_are_the_float64_scores_of_the_observed_steps_alone(transform):
    forecast, actual, observed, scale = _arrays()
    forward = np.log1p if transform == "log1p" else (lambda x: x)
    expected = _reference(forecast, actual, observed, scale, forward)
    for wild in (1e300, -1e9, np.nan, np.inf):  # what a filled step holds is never read
        given = np.where(observed, actual, wild)
        got = forecast_metrics(forecast, given, LEVELS, scale, transform, observed=observed)
        for key in ("mean_quantile_loss", "mean_quantile_loss_scaled"):
            assert got[key] == pytest.approx(expected[key], rel=1e-12)
        assert got["q_risk"] == pytest.approx(expected["q_risk"], rel=1e-12)
        assert got["p50_q_risk"] == got["q_risk"]["0.5"]
        assert got["p90_q_risk"] == got["q_risk"]["0.9"]
        loss = mean_quantile_loss(forecast, given, LEVELS, observed)
        assert loss == pytest.approx(expected["mean_quantile_loss"], rel=1e-12)
    # Every step scored: the masked route gives the unmasked scores.
    everything = np.ones_like(observed)
    unmasked = forecast_metrics(forecast, actual, LEVELS, scale, transform)
    masked = forecast_metrics(forecast, actual, LEVELS, scale, transform, observed=everything)
    for key in ("p50_q_risk", "p90_q_risk", "mean_quantile_loss", "mean_quantile_loss_scaled"):
        assert masked[key] == pytest.approx(unmasked[key], rel=1e-12)


def test_a_point_forecast_is_scored_on_the_observed_steps_at_every_level():
    forecast, actual, observed, _ = _arrays(1)
    point = forecast[..., 1]
    got = forecast_metrics(point, np.where(observed, actual, np.nan), LEVELS, observed=observed)
    expected = _reference(np.repeat(point[..., None], 3, axis=-1), actual, observed)
    assert got["q_risk"] == pytest.approx(expected["q_risk"], rel=1e-12)


@pytest.mark.parametrize(
    ("observed", "error", "message"),
    [
        (np.zeros((5, 4), bool), ValueError, r"observed marks none of the 20 steps"),
        (np.ones((5, 3), bool), ValueError, r"observed must have the shape of actual \(5, 4\)"),
        (np.ones((5, 4)), TypeError, r"observed must be a bool array"),
    ],
)
def test_a_mask_scoring_nothing_or_of_another_shape_or_kind_is_refused(observed, error, message):
    forecast, actual, _, _ = _arrays()
    with pytest.raises(error, match=message):
        forecast_metrics(forecast, actual, LEVELS, observed=observed)
    with pytest.raises(error, match=message):
        mean_quantile_loss(forecast, actual, LEVELS, observed)


def test_a_missing_actual_without_a_mask_is_still_an_error_naming_the_way_to_mask():
    forecast, actual, observed, _ = _arrays()
    missing = actual.copy()
    missing[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"actual holds 1 values that are not finite .*observed"):
        forecast_metrics(forecast, missing, LEVELS)
    # A zero sum over the observed steps leaves q-risk undefined, whatever the others hold.
    with pytest.raises(ValueError, match=r"sum\(\|target\|\) is zero"):
        forecast_metrics(forecast, np.where(observed, 0.0, 5.0), LEVELS, observed=observed)


# ---------------------------------------------------------------------------- data


def _stores(folder) -> pd.DataFrame:
    """The stores table with the targets of `BLANK` emptied and the rows of `DROPPED` removed."""
    table = pd.read_csv(write_table(folder / "stores.csv"))
    keys = list(zip(table["store"], table["day"], strict=True))
    table.loc[[key in BLANK for key in keys], "sales"] = np.nan
    return table[[key not in DROPPED for key in keys]].reset_index(drop=True)


def _quiet_prepare(table, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the filled steps are announced
        return prepare_dataset(table, **options)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return _stores(tmp_path_factory.mktemp("filled"))


@pytest.fixture(scope="module")
def complete(tmp_path_factory):
    """The stores table without a missing target."""
    return pd.read_csv(write_table(tmp_path_factory.mktemp("complete") / "stores.csv"))


def _touching(windows, series_ids) -> np.ndarray:
    """(N,) bool: the windows whose horizon holds a (series, day) of `MISSING`, by their times."""
    return np.array(
        [
            any(
                (series_ids[code], day) in MISSING
                for day in pd.date_range(start, periods=HORIZON, freq="D")
            )
            for code, start in zip(windows.series_code, windows.forecast_start, strict=True)
        ]
    )


def test_windows_over_a_missing_target_are_kept_with_only_those_steps_masked(table, complete):
    complete = _quiet_prepare(complete, **DATA.prepare_options())
    strict = _quiet_prepare(table, **DATA.prepare_options())
    kept = _quiet_prepare(table, **KEEP.prepare_options())
    by_series = np.zeros(len(complete.series_ids), np.int64)
    for split in ("train", "validation", "test"):
        every = complete.split(split)
        touching = _touching(every, complete.series_ids)
        by_series += np.bincount(every.series_code[touching], minlength=len(by_series))
        assert touching.any(), split
        # Kept: every window of the complete table; by default those over a gap are left out.
        assert len(kept.split(split)) == len(every)
        assert len(strict.split(split)) == len(every) - int(touching.sum())
        np.testing.assert_array_equal(kept.split(split).forecast_start, every.forecast_start)
        # Masked exactly at the missing (series, day) steps.
        windows = kept.split(split)
        mask = observed_steps(windows)
        for row, (code, start) in enumerate(zip(windows.series_code, windows.forecast_start,
                                                strict=True)):  # fmt: skip
            days = pd.date_range(start, periods=HORIZON, freq="D")
            expected = [(kept.series_ids[code], day) not in MISSING for day in days]
            np.testing.assert_array_equal(mask[row], expected)
        np.testing.assert_array_equal(windows.arrays()["target_mask"] == 1.0, mask)
        assert kept.summary()["masked_target_steps"][split] == int((~mask).sum())
    # Each missing day lies once in the horizon of each window it masks (no two within H).
    report = kept.missing_report()
    np.testing.assert_array_equal(report["windows_masked"], by_series)
    np.testing.assert_array_equal(report["masked_steps"], by_series)
    assert report["windows_left_out"].sum() == 0
    np.testing.assert_array_equal(strict.missing_report()["windows_left_out"], by_series)
    assert strict.missing_report()["windows_masked"].sum() == 0


def test_windows_whose_every_forecast_step_is_missing_are_left_out_and_counted(table, complete):
    # Nine days of beta's training targets emptied: the 3 windows (H = 7) inside the gap have
    # nothing to train on, the 12 that overlap it partly are kept with those steps masked.
    gap = pd.date_range("2024-02-10", periods=9, freq="D")
    days = pd.to_datetime(table["day"])
    emptied = table.assign(
        sales=table["sales"].where(~((table["store"] == "beta") & days.isin(gap)))
    )
    missing = MISSING | {("beta", day) for day in gap}
    with pytest.warns(UserWarning) as caught:
        kept = prepare_dataset(emptied, **KEEP.prepare_options())
    every = _quiet_prepare(complete, **DATA.prepare_options())
    blank = {"train": 0, "validation": 0, "test": 0}
    for split in blank:
        windows = every.split(split)
        # By their times: a window is kept unless each of its forecast days is missing.
        wanted, masked = [], 0
        for code, start in zip(windows.series_code, windows.forecast_start, strict=True):
            series = every.series_ids[code]
            hits = sum((series, day) in missing for day in pd.date_range(start, periods=HORIZON))
            if hits == HORIZON:
                blank[split] += 1
            else:
                wanted.append((series, start))
                masked += hits
        got = kept.split(split)
        assert [(kept.series_ids[c], s) for c, s in zip(got.series_code, got.forecast_start,
                                                        strict=True)] == wanted  # fmt: skip
        assert observed_steps(got).any(axis=1).all(), split
        assert kept.summary()["masked_target_steps"][split] == masked, split
    assert blank == {"train": 3, "validation": 0, "test": 0}
    report = kept.missing_report().set_index("store")
    assert report["windows_left_out"].to_dict() == {"alpha": 0, "beta": 3, "gamma": 0}
    message = str(caught[0].message)
    assert "and the 3 windows whose every forecast step is one are left out" in message
    # The default leaves out every window that overlaps the gap (15), besides the 21 over
    # the single missing days; the option would keep all but the 3 inside it.
    with pytest.warns(UserWarning) as caught:
        strict = prepare_dataset(emptied, **DATA.prepare_options())
    assert strict.missing_report().set_index("store").loc["beta", "windows_left_out"] == 15 + 5
    assert (
        "the 36 windows whose horizon holds one are left out (prepare_dataset's "
        "require_observed_target=False keeps the 33 of them with an observed step"
    ) in str(caught[0].message)


def test_the_announcement_counts_the_windows_kept_and_the_steps_masked(table):
    # Windows of each split whose horizon holds a missing day (H = 7): alpha's 2024-01-31
    # in 7 training windows, beta's 2024-03-15 in 5 validation windows (from 2024-03-11),
    # alpha's 2024-03-29 in 4 and gamma's 2024-04-05 in 5 test windows (2024-03-26 to
    # 2024-04-03): 21 windows, each with one step masked.
    kept = (
        r"; the 21 windows whose horizon holds one are kept, their 21 filled forecast steps "
        r"masked \(target_mask 0: left out of the loss and the scores\)"
    )
    with pytest.warns(UserWarning, match=r"^filled 4 missing target steps .*" + kept):
        prepare_dataset(table, **KEEP.prepare_options())
    left_out = r"; the 21 windows whose horizon holds one are left out \(prepare_dataset's "
    with pytest.warns(UserWarning, match=r"^filled 4 missing target steps .*" + left_out):
        prepare_dataset(table, **DATA.prepare_options())


# ---------------------------------------------------------------------------- steps


def _masked_batch(seed: int):
    batch = linear_batch(seed, rows=4)
    mask = np.ones(np.shape(batch.target), np.float32)
    mask[0, 1] = mask[2, 0] = 0.0
    return batch.replace(target_mask=mask)


def _step(batch):
    """`(loss, eval loss, parameters after one step)` of the linear model from one init."""
    tx = optax.sgd(0.1)  # the update is the gradient, scaled: equal updates, equal gradients
    state = create_train_state(LINEAR_MODEL, tx, jax.random.key(0), linear_batch(0, rows=4))
    evaluated = float(eval_step(state, batch))
    state, metrics = train_step(state, batch, jax.random.key(1))
    return float(metrics["loss"]), evaluated, jax.tree.map(np.asarray, state.params)


def test_the_loss_and_gradients_ignore_targets_at_masked_steps_and_follow_observed_ones():
    batch = _masked_batch(3)
    loss, evaluated, params = _step(batch)
    masked = np.asarray(batch.target_mask) == 0
    for wild in (1e6, -1e6, np.nan):
        moved = batch.replace(target=np.where(masked, wild, batch.target).astype(np.float32))
        again, evaluated_again, params_again = _step(moved)
        assert again == loss and evaluated_again == evaluated
        jax.tree.map(np.testing.assert_array_equal, params_again, params)
    observed = np.array(batch.target)
    observed[1, 1] += 5.0  # an observed target moves both
    other, evaluated_other, params_other = _step(batch.replace(target=observed))
    assert other != loss and evaluated_other != evaluated
    assert not np.array_equal(params_other["w"], params["w"])
    # The loss is the float64 mean pinball loss over the observed targets alone.
    state = create_train_state(
        LINEAR_MODEL, optax.sgd(0.1), jax.random.key(0), linear_batch(0, rows=4)
    )
    forecast = np.asarray(LINEAR_MODEL.apply(state.variables, *_inputs(batch)).quantiles)
    target = np.asarray(batch.target, np.float64)
    losses = [
        _pinball(target[i, h], np.float64(forecast[i, h, k]), level)
        for i, h in zip(*np.nonzero(~masked), strict=True)
        for k, level in enumerate(LINEAR_QUANTILES)
    ]
    assert evaluated == pytest.approx(np.mean(losses), rel=1e-5)


def _inputs(batch):
    return batch.static, batch.historical, batch.future


# ---------------------------------------------------------------------------- Forecaster


@pytest.fixture(scope="module")
def fits(table, tmp_path_factory):
    """`(default, kept, checkpoints of the default)`: the two fits of the stores table."""
    folder = tmp_path_factory.mktemp("fits")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        default = Forecaster(DATA, MODEL, TINY_TRAINING).fit(
            table, checkpoint_dir=folder / "checkpoints", quiet=True
        )
        kept = Forecaster(KEEP, MODEL, TINY_TRAINING).fit(table, quiet=True)
    return default, kept, folder / "checkpoints"


def _quiet(call, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return call(*args, **kwargs)


def test_the_fit_trains_on_every_window_with_masks_where_the_default_leaves_windows_out(fits):
    default, kept, _ = fits
    for split in ("train", "validation", "test"):
        assert len(kept.dataset.split(split)) > len(default.dataset.split(split))
    train = kept.dataset.train.arrays()["target_mask"]
    assert (train == 0).sum() == kept.summary["dataset"]["masked_target_steps"]["train"] > 0
    assert (default.dataset.train.arrays()["target_mask"] == 1).all()
    assert kept.summary["dataset"]["require_observed_target"] is False
    assert all(np.isfinite(loss) for loss in kept.history["fp32"]["val_loss"])


def _frame(forecaster, table):
    """The fp32 test forecasts with the table's actuals, as `tft-jax forecast` writes them."""
    dataset = _quiet(forecaster.prepare, table, "test")
    metrics, predictions = _quiet(forecaster.evaluation, dataset, "test")
    windows = dataset.test
    forecast = forecaster.postprocess(
        to_original_units(dataset, windows, predictions["fp32"].quantiles)
    )
    return metrics, forecast_frame(dataset, windows, forecast, forecaster.tft_config.quantiles)


def _scores(frame: pd.DataFrame, forecast_columns: dict[float, str]) -> dict[str, float]:
    """q-risk per level and the mean loss of `frame`'s rows with an observed `truth`."""
    rows = frame[frame["truth"].notna()]
    truth = rows["truth"].to_numpy(np.float64)
    losses = {
        q: _pinball(truth, rows[c].to_numpy(np.float64), q) for q, c in forecast_columns.items()
    }
    total = np.abs(truth).sum()
    return {
        "p50_q_risk": 2 * losses[0.5].sum() / total,
        "p90_q_risk": 2 * losses[0.9].sum() / total,
        "mean_quantile_loss": float(np.mean(np.stack(list(losses.values())))),
    }


def _truth(table: pd.DataFrame) -> pd.DataFrame:
    """The table's own targets by (store, day) on the full daily grid (NaN where missing)."""
    days = pd.date_range("2024-01-01", periods=100, freq="D")
    grid = pd.MultiIndex.from_product([["alpha", "beta", "gamma"], days], names=["store", "day"])
    own = table.assign(day=pd.to_datetime(table["day"])).set_index(["store", "day"])["sales"]
    return own.reindex(grid).rename("truth").reset_index()


def test_evaluate_scores_the_observed_steps_as_a_hand_computation_from_the_forecasts(
    fits, table, tmp_path
):
    _, kept, _ = fits
    metrics, frame = _frame(kept, table)
    truth = _truth(table)
    frame = frame.merge(truth, on=["store", "day"], how="left", validate="many_to_one")
    assert frame["truth"].isna().sum() == metrics["masked_steps"] > 0
    assert metrics["windows"] == len(frame) // HORIZON
    note = f"{metrics['masked_steps']} forecast steps without an observed target not scored"
    assert note in metrics_table(metrics)  # as `tft-jax evaluate` prints the scores
    expected = _scores(frame, {0.1: "p10", 0.5: "p50", 0.9: "p90"})
    for key, value in expected.items():
        assert metrics["models"]["fp32"][key] == pytest.approx(value, rel=1e-9), key
    # The seasonal naive baseline (7 days) on the same steps, from the forward-filled history.
    filled = truth.assign(truth=truth.groupby("store")["truth"].ffill())
    naive = filled.assign(day=filled["day"] + pd.Timedelta(days=7)).rename(
        columns={"truth": "naive"}
    )
    frame = frame.merge(naive, on=["store", "day"], how="left")
    assert frame["naive"].notna().all()
    expected = _scores(frame, dict.fromkeys((0.1, 0.5, 0.9), "naive"))
    baseline = metrics["models"]["seasonal_naive"]
    for key, value in expected.items():
        assert baseline[key] == pytest.approx(value, rel=1e-6), key
    # The forecast CSV shows a missing actual as an empty cell.
    write_forecasts(frame.drop(columns=["truth", "naive"]), tmp_path / "forecasts.csv")
    written = pd.read_csv(tmp_path / "forecasts.csv", keep_default_na=False)
    empty = written[written["actual"] == ""]
    assert len(empty) == metrics["masked_steps"]
    assert set(zip(empty["store"], empty["day"].str[:10], strict=True)) <= BLANK | DROPPED


def test_baselines_and_actuals_take_the_mask_and_refuse_a_missing_target_without_it(table):
    dataset = _quiet_prepare(table, **KEEP.prepare_options())
    windows = dataset.test
    observed = observed_steps(windows)
    masked = int((~observed).sum())
    assert masked == 4 + 5  # alpha's missing day in 4 test windows, gamma's in 5
    with pytest.raises(
        ValueError, match=rf"^{masked} forecast steps have no observed target.*obse"
    ):
        actuals(dataset, windows)
    got = actuals(dataset, windows, observed)
    assert np.isnan(got[~observed]).all() and np.isfinite(got[observed]).all()
    with pytest.raises(ValueError, match=rf"observed marks {masked} forecast steps without an obs"):
        actuals(dataset, windows, np.ones_like(observed))
    with pytest.raises(ValueError, match=r"no observed target"):
        baseline_metrics(dataset, windows, LEVELS, [7])
    scores = baseline_metrics(dataset, windows, LEVELS, [7], observed=observed)
    strict = _quiet_prepare(table, **DATA.prepare_options())
    fewer = baseline_metrics(strict, strict.test, LEVELS, [7])
    assert scores["seasonal_naive_7"]["p50_q_risk"] != fewer["seasonal_naive_7"]["p50_q_risk"]


def test_a_fitted_model_may_score_the_masked_windows_but_not_resume_with_them(
    fits, table, tmp_path
):
    default, _, checkpoints = fits
    scores = _quiet(default.evaluate, table)
    assert scores["masked_steps"] == 0
    widened = copy.copy(default)  # the same model, reading the table another way
    widened.config = dataclasses.replace(default.config, data=KEEP)
    wider = _quiet(widened.evaluate, table)
    assert wider["windows"] > scores["windows"] and wider["masked_steps"] > 0
    # Resuming the default's checkpoints on other windows is refused before training.
    copied = shutil.copytree(checkpoints, tmp_path / "checkpoints")
    resumed = Forecaster(KEEP, MODEL, TINY_TRAINING)
    with pytest.raises(
        ValueError, match=r"DataConfig.require_observed_target True then, False now"
    ):
        _quiet(resumed.fit, table, checkpoint_dir=copied, resume=True, quiet=True)


def test_backtest_scores_a_series_whose_horizon_holds_a_missing_target(fits, table):
    default, kept, _ = fits
    cutoff = pd.Timestamp("2024-04-03")  # gamma's horizon holds its missing 2024-04-05
    result = _quiet(kept.backtest, table, n_windows=2, step=3)
    assert "masked_steps" in result.columns
    rows = result[result["cutoff"] == cutoff].set_index("model")
    assert (rows["windows"] == 3).all() and (rows["masked_steps"] == 1).all()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        strict = default.backtest(table, n_windows=2, step=3)
    named = "'gamma' (its target at 2024-04-05 00:00:00 is missing)"
    assert any(named in str(warning.message) for warning in caught)
    assert "masked_steps" not in strict.columns
    assert (strict[strict["cutoff"] == cutoff]["windows"] == 2).all()
    # The backtest's fp32 scores at the cutoff are those of its three test windows.
    _, frame = _frame(kept, table)
    frame = frame[frame["forecast_start"] == cutoff].merge(
        _truth(table), on=["store", "day"], how="left"
    )
    expected = _scores(frame, {0.1: "p10", 0.5: "p50", 0.9: "p90"})
    for key, value in expected.items():
        assert rows.loc["fp32", key] == pytest.approx(value, rel=1e-6), key


def test_a_window_or_split_without_an_observed_step_is_named_not_scored_as_nan(fits, table):
    _, kept, _ = fits
    days = sorted(table["day"].unique())
    gamma_ends = table["sales"].where(~((table["store"] == "gamma") & table["day"].isin(days[-7:])))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = kept.backtest(table.assign(sales=gamma_ends), n_windows=1)
    assert (result["windows"] == 2).all() and np.isfinite(result["p50_q_risk"]).all()
    named = "'gamma' (its target is missing at all 7 steps from it)"
    assert any(named in str(warning.message) for warning in caught)
    # Kept windows none of whose steps is observed: refused when the table is read, before
    # any forecast (fitting on such a table would train a whole run, then fail to score).
    test_blank = table["sales"].where(~table["day"].isin(days[-15:]))
    with pytest.raises(
        ValueError, match=r"the test period .* holds 27 windows, but no forecast step of theirs "
        r"has an observed target"
    ):  # fmt: skip
        _quiet(kept.evaluate, table.assign(sales=test_blank))
    with pytest.raises(ValueError, match=r"the test period .* no forecast step of theirs"):
        _quiet(Forecaster(KEEP, MODEL, TINY_TRAINING).fit, table.assign(sales=test_blank))


# ---------------------------------------------------------------------------- run folders


def test_the_setting_survives_save_and_load(fits, table, tmp_path):
    _, kept, _ = fits
    folder = kept.save(tmp_path / "run")
    config = json.loads((folder / "config.json").read_text())
    assert config["format_version"] == run_folder.FORMAT_VERSION == 4
    assert config["data"]["require_observed_target"] is False
    loaded = Forecaster.load(folder)
    assert loaded.config == kept.config
    scores, again = (_quiet(forecaster.evaluate, table) for forecaster in (kept, loaded))
    assert again["windows"] == scores["windows"] and again["masked_steps"] == scores["masked_steps"]
    for key in ("p50_q_risk", "p90_q_risk", "mean_quantile_loss"):
        assert again["models"]["fp32"][key] == pytest.approx(scores["models"]["fp32"][key])


def test_an_earlier_folder_without_the_field_loads_as_it_trained_and_an_older_reader_refuses(
    fits, tmp_path, monkeypatch
):
    default, _, _ = fits
    folder = default.save(tmp_path / "run")

    def as_version_2(config):
        config["format_version"] = 2
        del config["data"]["require_observed_target"]

    earlier = edited(folder, tmp_path / "v2", as_version_2)
    loaded = Forecaster.load(earlier)
    assert loaded.config.data.require_observed_target is True
    assert loaded.config == default.config
    # From version 3 on it is always there: one without it was edited by hand.
    by_hand = edited(folder, tmp_path / "v4", lambda c: c["data"].pop("require_observed_target"))
    with pytest.raises(
        RunFolderError,
        match=r"data\.require_observed_target is missing from a folder of format "
        "version 4",
    ):
        Forecaster.load(by_hand)
    # A tft-jax that reads versions 1 to 2 refuses this folder by its version, not as damaged.
    monkeypatch.setattr(run_folder, "FORMAT_VERSION", 2)
    with pytest.raises(
        RunFolderError,
        match=r"version 4, saved by tft-jax .* reads 'tft-jax-forecaster' "
        r"versions 1 to 2\. Upgrade tft-jax to load it",
    ):
        Forecaster.load(folder)


# ---------------------------------------------------------------------------- messages


def _all_windows_filled(table: pd.DataFrame) -> pd.DataFrame:
    """`table` with days 76 and 78 missing in every series: each validation window holds one."""
    days = {"2024-03-17", "2024-03-19"}
    return table.assign(sales=table["sales"].where(~table["day"].isin(days)))


def test_each_route_names_the_option_its_caller_has(table):
    blank = _all_windows_filled(table)
    # prepare_dataset: its keyword.
    with pytest.raises(ValueError, match=r"pass prepare_dataset's require_observed_target=False"):
        _quiet_prepare(blank, **DATA.prepare_options())
    # The Forecaster: its setting, still raised as the data layer's error.
    with pytest.raises(ValueError) as caught:
        _quiet(Forecaster(DATA, MODEL, TINY_TRAINING).fit, blank, quiet=True)
    message = str(caught.value)
    assert "pass DataConfig.require_observed_target=False to keep the 27 of them" in message
    assert "prepare_dataset" not in message
    assert caught.traceback[-1].frame.f_globals["__name__"].startswith("tft_jax.data.")
    # The command line: its flag.
    train = build_parser().parse_args(["train", "--out", "run"])
    assert "pass --no-require-observed-target to keep the 27 of them" in cli_text(message, train)
    # Kept, it prepares (each window has observed steps).
    assert len(_quiet_prepare(blank, **KEEP.prepare_options()).validation) > 0


def test_the_forecasters_warning_names_its_setting_at_the_callers_line(fits, table):
    default, _, _ = fits
    with pytest.warns(UserWarning, match=r"left out \(DataConfig.require_observed_target=False "
                      r"keeps the 21 of them with an observed step") as caught:  # fmt: skip
        default.prepare(table, "test")
    ours = [w for w in caught if "require_observed_target" in str(w.message)]
    assert ours[0].filename == __file__
    assert "prepare_dataset" not in str(ours[0].message)
    evaluate = build_parser().parse_args(["evaluate", "--run", "run"])
    assert "(a run trained with --no-require-observed-target keeps the 21 of them" in cli_text(
        str(ours[0].message), evaluate
    )


def test_a_setting_that_is_not_a_bool_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"^DataConfig.require_observed_target must be a bool, "):
        DataConfig.pedestrian(require_observed_target="no")
    with pytest.raises(TypeError, match=r"DataConfig.require_observed_target must be a bool"):
        DataConfig.pedestrian(require_observed_target=0)


def test_the_command_line_flag_reaches_the_settings_config_json_records():
    parser = build_parser()
    for argv, expected in (([], True), (["--no-require-observed-target"], False),
                           (["--require-observed-target"], True)):  # fmt: skip
        args = parser.parse_args(["train", "--out", "run", *argv])
        settings = forecaster_config(args, qat=False)
        assert settings.data.require_observed_target is expected
        assert settings.to_json()["data"]["require_observed_target"] is expected
    args = parser.parse_args(["experiment", "clipping", "--no-require-observed-target"])
    assert forecaster_config(args, qat=False).data.require_observed_target is False


def test_an_actual_outside_log1p_s_domain_is_named_by_window_and_step_under_a_mask():
    # The check ran on the flattened observed steps and named index (10,), not (2, 3).
    actual = np.ones((3, 4))
    actual[2, 3], actual[0, 0] = -2.0, np.nan
    observed = np.ones((3, 4), dtype=bool)
    observed[0, 0] = False
    with pytest.raises(ValueError, match=r"the first -2\.0 at index \(2, 3\)"):
        forecast_metrics(np.ones((3, 4, 3)), actual, LEVELS, np.ones(3), "log1p", observed=observed)
