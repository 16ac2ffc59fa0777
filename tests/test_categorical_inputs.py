"""Categorical known and observed inputs: embedded, selected, validated, trained and forecast.

One small config with a categorical static, known and observed input (and
known history) serves the model tests: one jitted forward and one jitted
gradient. The Forecaster test fits a tiny model on a table with a text
known column and a text static column.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

import qat
from tft_jax.config import TFTConfig
from tft_jax.evaluation import to_batch
from tft_jax.forecaster import DataConfig, Forecaster, ModelConfig, TrainingConfig
from tft_jax.model import TemporalFusionTransformer
from tft_jax.train import Batch

B, T, H = 2, 4, 2
CONFIG = TFTConfig(
    num_static_features=1,
    num_known_features=1,
    num_observed_features=1,
    hidden_dim=8,
    num_heads=2,
    sequence_length=T,
    prediction_horizon=H,
    dropout_rate=0.0,
    static_categorical_cardinalities=(2,),
    known_categorical_cardinalities=(3,),
    observed_categorical_cardinalities=(4,),
    use_known_history=True,
)
MODEL = TemporalFusionTransformer(CONFIG)
CATEGORICAL = ("known_categorical_history", "future_categorical", "observed_categorical")


def inputs(**overrides: np.ndarray) -> dict[str, np.ndarray]:
    """Model inputs as keywords. Known codes: 0 over the history, 1 over the horizon
    (row 2 of the known table is never used); observed codes 0..3."""
    rng = np.random.default_rng(0)
    arrays = {
        "static": rng.normal(size=(B, 1)).astype(np.float32),
        "historical": rng.normal(size=(B, T, 1)).astype(np.float32),
        "future": rng.normal(size=(B, H, 1)).astype(np.float32),
        "known_history": rng.normal(size=(B, T, 1)).astype(np.float32),
        "static_categorical": np.array([[0], [1]], np.int32),
        "known_categorical_history": np.zeros((B, T, 1), np.int32),
        "future_categorical": np.ones((B, H, 1), np.int32),
        "observed_categorical": (np.arange(B * T).reshape(B, T, 1) % 4).astype(np.int32),
    }
    return {**arrays, **overrides}


@functools.cache
def variables() -> dict:
    return jax.jit(MODEL.init)(jax.random.key(0), **inputs())


@functools.cache
def _forward():
    return jax.jit(lambda v, kwargs: MODEL.apply(v, **kwargs, deterministic=True))


def forward(**overrides: np.ndarray):
    return _forward()(variables(), inputs(**overrides))


def test_selection_weights_have_one_column_per_input_in_the_documented_order():
    out = forward()
    # history: observed real, observed categorical, known real, known categorical
    assert out.history_weights.shape == (B, T, 4)
    # future: known real, known categorical
    assert out.future_weights.shape == (B, H, 2)
    assert out.static_weights.shape == (B, 2)
    # Changing the observed code at step 1 moves the history weights at step 1 only.
    codes = inputs()["observed_categorical"].copy()
    codes[:, 1] = (codes[:, 1] + 1) % 4
    moved = np.abs(
        np.asarray(forward(observed_categorical=codes).history_weights - out.history_weights)
    )
    assert moved[:, 1].max() > 1e-4
    assert moved[:, [0, 2, 3]].max() == 0.0


def test_a_future_categorical_code_changes_the_forecast_from_its_step_on():
    base = np.asarray(forward().quantiles)
    codes = inputs()["future_categorical"].copy()
    codes[:, -1] = 2
    changed = np.asarray(forward(future_categorical=codes).quantiles)
    np.testing.assert_array_equal(changed[:, :-1], base[:, :-1])
    assert np.abs(changed[:, -1] - base[:, -1]).max() > 1e-4


def test_gradients_reach_exactly_the_embedding_rows_the_codes_select():
    def loss(params):
        out = MODEL.apply({"params": params}, **inputs(), deterministic=True)
        return jnp.sum(out.quantiles * jnp.cos(jnp.arange(out.quantiles.size)).reshape(-1, H, 3))

    grads = jax.jit(jax.grad(loss))(variables()["params"])

    def row_norms(module: str) -> np.ndarray:
        return np.linalg.norm(np.asarray(grads[module]["embedding_0"]), axis=-1)

    known = row_norms("known_categorical_embedding")
    assert known[0] > 0.0, "the known codes over the history (0) get no gradient"
    assert known[1] > 0.0, "the known codes over the horizon (1) get no gradient"
    assert known[2] == 0.0, "an unused known code gets a gradient"
    assert (row_norms("observed_categorical_embedding") > 0.0).all()
    assert (row_norms("static_categorical_embedding") > 0.0).all()


INVALID = [
    ("future_categorical", np.ones((B, H, 2), np.int32), r"future_categorical must have shape"),
    ("future_categorical", np.ones((B, H, 1), np.float32), r"future_categorical must be integer"),
    ("future_categorical", np.full((B, H, 1), 3, np.int32), r"future_categorical\[.*\[0, 3\)"),
    ("future_categorical", None, r"future_categorical is required"),
    ("observed_categorical", np.full((B, T, 1), -1, np.int32), r"observed_categorical\[.*\[0, 4"),
    ("observed_categorical", np.ones((B, T), np.int32), r"observed_categorical must have shape"),
    ("known_categorical_history", np.ones((B, 5, 1), np.int32), r"known_categorical_history must"),
    ("known_categorical_history", None, r"known_categorical_history is required"),
]


@pytest.mark.parametrize(("name", "value", "match"), INVALID)
def test_invalid_categorical_inputs_raise_value_error_naming_the_argument(name, value, match):
    with pytest.raises(ValueError, match=match):
        MODEL.apply(variables(), **inputs(**{name: value}), deterministic=True)


def test_categorical_inputs_the_config_does_not_take_are_refused():
    plain = TemporalFusionTransformer(
        TFTConfig(num_static_features=1, num_known_features=1, num_observed_features=1,
                  hidden_dim=8, num_heads=2, sequence_length=T, prediction_horizon=H)
    )  # fmt: skip
    reals = {k: inputs()[k] for k in ("static", "historical", "future")}
    for name in ("future_categorical", "observed_categorical", "known_categorical_history"):
        with pytest.raises(ValueError, match=f"{name} was given but the config has no"):
            jax.eval_shape(plain.init, jax.random.key(0), **reals, **{name: inputs()[name]})
    no_history = TemporalFusionTransformer(
        TFTConfig(num_static_features=1, num_known_features=1, num_observed_features=1,
                  hidden_dim=8, num_heads=2, sequence_length=T, prediction_horizon=H,
                  known_categorical_cardinalities=(3,))
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"known_categorical_history was given but.*use_known"):
        jax.eval_shape(
            no_history.init,
            jax.random.key(0),
            **reals,
            future_categorical=inputs()["future_categorical"],
            known_categorical_history=inputs()["known_categorical_history"],
        )


def test_categoricals_add_only_their_embedding_tables_to_the_parameter_tree():
    without = TFTConfig(
        **{
            **{f.name: getattr(CONFIG, f.name) for f in CONFIG.__dataclass_fields__.values()},
            "known_categorical_cardinalities": (),
            "observed_categorical_cardinalities": (),
        }
    )
    real = {k: v for k, v in inputs().items() if k not in CATEGORICAL}
    plain = jax.eval_shape(TemporalFusionTransformer(without).init, jax.random.key(0), **real)
    assert set(variables()["params"]) - set(plain["params"]) == {
        "known_categorical_embedding",
        "observed_categorical_embedding",
    }
    assert not {"known_categorical_embedding", "observed_categorical_embedding"} & set(
        plain["params"]
    )


def batch(**overrides: np.ndarray) -> Batch:
    arrays = inputs(**overrides)
    return to_batch({**arrays, "target": np.zeros((B, H), np.float32)})


def test_to_batch_carries_the_categorical_inputs_and_leaves_absent_ones_none():
    sample = batch()
    for name in CATEGORICAL:
        np.testing.assert_array_equal(getattr(sample, name), inputs()[name])
    real = {k: v for k, v in inputs().items() if k not in CATEGORICAL}
    plain = to_batch({**real, "target": np.zeros((B, H), np.float32)})
    assert all(getattr(plain, name) is None for name in CATEGORICAL)


def test_the_qat_and_int8_models_take_the_categorical_inputs():
    qat_model = qat.QATTemporalFusionTransformer(CONFIG, qat.QATConfig(bits=8))
    qat_vars = qat.from_fp32(variables(), qat_model, **inputs())
    qat_vars = qat.calibrate(qat_model, qat_vars, [batch()])
    int8_vars = qat.convert(qat_vars)
    for module in ("known_categorical_embedding", "observed_categorical_embedding"):
        assert int8_vars["params"][module]["embedding_0"].dtype == jnp.float32
    codes = np.full((B, H, 1), 2, np.int32)
    apply_int8 = jax.jit(lambda v, kwargs: qat.int8_apply(qat_model, v, **kwargs))
    integer = apply_int8(int8_vars, inputs())
    changed = apply_int8(int8_vars, inputs(future_categorical=codes))
    fake = jax.jit(
        lambda v, kwargs: qat_model.apply(v, **kwargs, calibrate=False, deterministic=True)
    )(qat_vars, inputs())
    np.testing.assert_allclose(integer.quantiles, fake.quantiles, atol=1e-3)
    assert np.abs(np.asarray(changed.quantiles - integer.quantiles)).max() > 1e-4


def _holiday_table() -> pd.DataFrame:
    """Three daily stores with a text static ('region') and a text known input ('holiday')."""
    rng = np.random.default_rng(0)
    frames = []
    for code, (store, region) in enumerate((("a", "north"), ("b", "south"), ("c", "north"))):
        days = pd.date_range("2024-01-01", periods=60, freq="D")
        holiday = np.where(rng.random(60) < 0.25, "xmas", "plain")
        sales = 10 + 2 * code + 5 * (holiday == "xmas") + rng.normal(scale=0.3, size=60)
        frames.append(
            pd.DataFrame(
                {"store": store, "day": days.strftime("%Y-%m-%d"), "sales": sales,
                 "region": region, "holiday": holiday}
            )
        )  # fmt: skip
    return pd.concat(frames, ignore_index=True)


def test_a_forecaster_with_a_text_known_column_forecasts_an_unseen_category(tmp_path):
    table = _holiday_table()
    data = DataConfig(
        id_col="store", time_col="day", target="sales", freq="D", static_cols=("region",),
        known_cols=("holiday",), history=7, horizon=3, validation_fraction=0.2, test_fraction=0.2,
    )  # fmt: skip
    training = TrainingConfig(
        batch_size=8, max_steps=2, eval_every=2, validation_windows=8, eval_batch_size=8
    )
    forecaster = Forecaster(data, ModelConfig(hidden_dim=8, num_heads=2), training)
    forecaster.fit(table, quiet=True)
    config = forecaster.tft_config
    assert config.known_categorical_cardinalities == (3,)  # plain, xmas, unknown
    dataset = forecaster.prepare(table)
    assert dataset.future_weight_names[-1] == "holiday"
    assert dataset.history_weight_names[-1] == "holiday"
    assert len(dataset.future_weight_names) == config.num_future_inputs
    assert len(dataset.history_weight_names) == config.num_history_inputs
    assert dataset.static_weight_names[-1] == "region"
    history = table[table["day"] < "2024-02-20"]
    days = pd.date_range("2024-02-20", periods=3, freq="D").strftime("%Y-%m-%d")
    future = pd.DataFrame(
        [(store, day, "plain") for store in "abc" for day in days],
        columns=["store", "day", "holiday"],
    )
    columns = ["q0.1", "q0.5", "q0.9"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        base = forecaster.predict(history, future)[columns].to_numpy()
    assert not [w for w in caught if "not seen in training" in str(w.message)]
    xmas = forecaster.predict(history, future.assign(holiday="xmas"))[columns].to_numpy()
    assert np.abs(xmas - base).max() > 1e-4
    with pytest.warns(UserWarning, match=r"'holiday' has values not seen in training.*easter"):
        unseen = forecaster.predict(history, future.assign(holiday="easter"))
    assert np.isfinite(unseen[columns].to_numpy()).all()
    assert np.abs(unseen[columns].to_numpy() - base).max() > 1e-6
    loaded = Forecaster.load(forecaster.save(tmp_path / "run"))  # its weights pass the load check
    np.testing.assert_array_equal(loaded.predict(history, future)[columns].to_numpy(), base)


@pytest.mark.parametrize(
    ("field", "code", "message"),
    [
        ("static_categorical", 7, r"static_categorical\[:, 0\] must lie in \[0, 2\)"),
        ("observed_categorical", 4, r"observed_categorical\[:, :, 0\] must lie in \[0, 4\)"),
    ],
)
def test_train_predict_and_evaluate_refuse_codes_beyond_the_cardinality(field, code, message):
    # Inside the jitted steps the codes are traced and the embedding clipped them: a code
    # beyond the cardinality trained and forecast as the last category, silently.
    from tft_jax import train

    arrays = inputs()
    target = np.zeros((B, H), np.float32)
    tx = train.make_optimizer(learning_rate=1e-3, clip_norm=1.0, weight_decay=0.0)
    good = Batch(**{key: arrays[key] for key in arrays}, target=target)
    # The module's variables (compiled once for the file), not a second init compiled here.
    state = train.create_train_state(MODEL, tx, jax.random.key(0), good, variables=variables())
    codes = arrays[field].copy()
    codes.flat[0] = code
    bad = dataclasses.replace(good, **{field: codes})
    for name, call in (
        ("train_step", lambda: train.train_step(state, bad, jax.random.key(1))),
        ("predict", lambda: train.predict(state, bad)),
        ("evaluate", lambda: train.evaluate(state, [bad])),
    ):
        with pytest.raises(ValueError, match=rf"{name}: TemporalFusionTransformer: {message}"):
            call()
