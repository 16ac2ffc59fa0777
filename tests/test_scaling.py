"""`tft_jax.data.scaling`: each series' target scaler is that series' own statistics,
whatever the order of the rows, and a series new at scoring is scaled by its rows before
the cut. References are the statistics of each series' values alone and float64 NumPy."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset
from tft_jax.data.scaling import TargetScaler, target_statistics


@pytest.mark.parametrize("method", ["standard", "robust", "mean_abs"])
def test_target_scaler_of_shuffled_rows_is_each_series_own_statistics(method):
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 5, 400)  # rows of the series interleaved, not sorted
    values = rng.gamma(2.0, 10.0, 400) * (codes + 1)
    values[rng.random(400) < 0.1] = np.nan
    values[codes == 3] = np.round(values[codes == 3] / 50.0)  # many ties: robust's fallback
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = TargetScaler.fit(values, codes, 5, method)
    for code in range(5):
        mine = values[(codes == code) & ~np.isnan(values)]  # in row order
        loc, scale, _, _ = target_statistics(mine, method)
        assert fitted.loc[code] == loc and fitted.scale[code] == scale
    if method == "standard":  # and an independent float64 reference
        mine = values[(codes == 2) & ~np.isnan(values)]
        np.testing.assert_allclose(
            [fitted.loc[2], fitted.scale[2]], [mine.mean(), mine.std()], rtol=1e-12
        )


def test_target_scaler_names_a_series_without_values_among_unsorted_codes():
    codes = np.array([2, 0, 2, 0])
    with pytest.raises(ValueError, match="series 'b' has no observed target"):
        TargetScaler.fit(np.array([1.0, 2.0, 3.0, 4.0]), codes, 3, series_names=["a", "b", "c"])


def test_new_series_scalers_are_fitted_on_their_rows_before_the_cut():
    rng = np.random.default_rng(1)
    times = pd.date_range("2024-01-01", periods=40, freq="D")
    table = pd.concat(
        [
            pd.DataFrame({"id": series, "time": times, "y": rng.normal(10 * k, k + 1, 40)})
            for k, series in enumerate(["a", "b", "c", "d"])
        ],
        ignore_index=True,
    )
    table.loc[(table["id"] == "d") & (table["time"] < times[25]), "y"] = np.nan  # none early
    train = table[table["id"].isin(["a", "b"])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = prepare_dataset(
            train, id_col="id", time_col="time", target="y", freq="D", history=5,
            horizon=2, max_missing_fraction=1.0,
        ).preprocessor  # fmt: skip
        grid = table.assign(y_missing=table["y"].isna().astype(float))
        grid["y"] = grid.groupby("id")["y"].ffill()
        cuts = (times[20], times[30])
        scaler = fitted.transform(grid, cuts).target_scaler
    for code, series in enumerate(["a", "b", "c", "d"]):
        if series in ("a", "b"):
            assert scaler.loc[code] == fitted.target_scaler.loc[code]
            continue
        rows = (table["id"] == series).to_numpy() & table["y"].notna().to_numpy()
        for cut in cuts:  # the first cut under which the series has a value
            values = table["y"].to_numpy()[rows & (table["time"] < cut).to_numpy()]
            if values.size:
                break
        loc, scale, _, _ = target_statistics(values, "standard")
        assert scaler.loc[code] == loc and scaler.scale[code] == scale
    assert scaler.loc[3] == np.mean(table.loc[(table["id"] == "d") & (table["time"] >= times[25])
                                              & (table["time"] < times[30]), "y"])  # fmt: skip


def test_mean_abs_scale_is_the_mean_magnitude_and_robust_the_median_and_iqr():
    # References in float64 NumPy: 'mean_abs' is (0, mean |y|); 'robust' is (median,
    # interquartile range) with np.quantile's default (linear) interpolation, and for a
    # series whose interquartile range is 0 the mean absolute deviation from the median.
    signed = np.array([-3.0, 1.0, -2.0, 4.0])  # mean |y| 2.5, |mean y| 0
    skewed = np.array([7.0, -1.0, 2.5, 10.0, 0.0, 3.0, -4.0])
    spiky = np.array([2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 9.0, -5.0])  # interquartile range 0
    values = np.concatenate([signed, skewed, spiky])
    codes = np.repeat([0, 1, 2], [signed.size, skewed.size, spiky.size])
    mean_abs = TargetScaler.fit(values, codes, 3, "mean_abs")
    np.testing.assert_allclose(mean_abs.loc, 0.0)
    want = [np.mean(np.abs(v)) for v in (signed, skewed, spiky)]
    np.testing.assert_allclose(mean_abs.scale, want, rtol=1e-12)
    assert mean_abs.scale[0] == 2.5
    with pytest.warns(UserWarning):  # the spread fallback of 'spiky' is announced
        robust = TargetScaler.fit(values, codes, 3, "robust")
    q25, q50, q75 = np.quantile(skewed, [0.25, 0.5, 0.75])
    np.testing.assert_allclose([robust.loc[1], robust.scale[1]], [q50, q75 - q25], rtol=1e-12)
    assert (robust.loc[1], robust.scale[1]) == (2.5, 5.5)  # quartiles -0.5 and 5 of 7
    np.testing.assert_allclose(robust.loc[2], np.median(spiky), rtol=1e-12)
    np.testing.assert_allclose(robust.scale[2], np.mean(np.abs(spiky - 2.0)), rtol=1e-12)
    assert robust.scale[2] == 1.75  # (7 + 7) / 8
