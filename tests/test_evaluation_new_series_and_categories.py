"""Tables scored after training holding what training did not see: a new series in a
backtest (its scaler fitted on the steps before the first cutoff, counted on the freq grid),
and categories unseen in training (named with their type when they differ only in it)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from tft_jax.data import prepare_dataset


def hours(name: str, first: int, last: int, seed: int) -> pd.DataFrame:
    times = pd.date_range("2021-03-01", periods=200, freq="h")[first : last + 1]
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"id": name, "time": times, "y": 10.0 + rng.normal(size=len(times))})


def test_a_backtests_new_series_cut_counts_freq_steps_over_a_stretch_no_series_covers():
    # Forecaster.backtest places its cutoffs on the freq grid, but the cut for a new
    # series counted back over the times some series has: hours 59..71 held no series,
    # so 25 scored steps reached back to hour 44 instead of the first cutoff, hour 56,
    # and series 'c' (target at hours 44..55) was refused.
    spec = dict(id_col="id", time_col="time", target="y", freq="h", history=6, horizon=3)
    train = pd.concat([hours(s, 0, 59, seed) for seed, s in enumerate("abd")], ignore_index=True)
    preprocessor = prepare_dataset(train, **spec).preprocessor
    new = hours("c", 44, 55, seed=7)
    table = pd.concat([hours("b", 50, 58, 1), hours("d", 72, 80, 2), new], ignore_index=True)
    scored = 3 + 22  # backtest(n_windows=2, step=22, horizon 3): cutoffs at hours 56 and 78
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # 'c' is new
        dataset = prepare_dataset(
            table, **spec, preprocessor=preprocessor, validation_fraction=0.0,
            test_fraction=0.0, scored=scored,
        )  # fmt: skip
    code = dataset.series_ids.index("c")
    values = new["y"].to_numpy(np.float64)  # all of 'c' lies before the first cutoff
    np.testing.assert_allclose(
        (dataset.target_scaler.loc[code], dataset.target_scaler.scale[code]),
        (values.mean(), values.std()),
        rtol=1e-12,
    )


def test_an_unseen_category_that_differs_only_in_type_is_named_with_its_type():
    rng = np.random.default_rng(0)
    times = pd.date_range("2021-03-01", periods=60, freq="h")
    frames = [pd.DataFrame({"id": s, "time": times, "y": 10.0 + rng.normal(size=60)}) for s in "ab"]
    table = pd.concat(frames, ignore_index=True)
    table["kind"] = rng.integers(1, 3, len(table))
    preprocessor = prepare_dataset(
        table, id_col="id", time_col="time", target="y", freq="h", history=6, horizon=3,
        known_cols=["kind"], categorical_cols=["kind"],
    ).preprocessor  # fmt: skip
    assert preprocessor.vocabularies["kind"] == (1, 2)
    # The message listed ['1', '2', '3'] for the texts '1', '2' and the number 3 alike.
    with pytest.warns(UserWarning) as caught:
        codes = preprocessor.encode("kind", pd.Series(["1", 2, 3], dtype=object))
    np.testing.assert_array_equal(codes, [2, 1, 2])
    (message,) = [str(w.message) for w in caught]
    assert "coded as unknown: ['1', 3]; '1' (str) is 1 (int) in training" in message
    assert "df['kind'].astype(int)" in message
    with pytest.warns(UserWarning) as caught:
        preprocessor.encode("kind", pd.Series([3, 4]))
    (message,) = [str(w.message) for w in caught]
    assert message.endswith("coded as unknown: [3, 4]")  # no type hint without a twin
