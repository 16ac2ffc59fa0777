"""The settings of a forecasting run: data, model, training and QAT, each default stated once.

Every other place reads these dataclasses: the `Forecaster`, the CLI's
argparse defaults and help, `config.json` (written with `dataclasses.asdict`
and read back with `from_json`), the demo and the README. Each validates
itself on construction (`ValueError`/`TypeError` naming the field).
"""

from __future__ import annotations

import codecs
import dataclasses
import math
import numbers
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from tft_jax.config import check_hidden_dim
from tft_jax.data import TARGET_SCALERS, TableSpec
from tft_jax.data.listing import repeated
from tft_jax.data.pedestrian import PEDESTRIAN_SPEC
from tft_jax.data.scaling import TARGET_TRANSFORMS
from tft_jax.data.tables import parse_time_text
from tft_jax.data.windows import check_normalized_history

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def _require_int(owner: str, name: str, value: Any, minimum: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}.{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{owner}.{name} must be >= {minimum}, got {value}")


def _require_float(
    owner: str,
    name: str,
    value: Any,
    low: float,
    high: float | None = None,
    *,
    open_low: bool = True,
) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}.{name} must be a number, got {type(value).__name__} {value!r}")
    # NaN compares False with everything, so it is refused by name, as is inf. Past the
    # finiteness check, `not value < high` is `value >= high` (numbers.Real declares no >=).
    below = value <= low if open_low else value < low
    if not math.isfinite(value) or below or (high is not None and not value < high):
        bounds = f"{'(' if open_low else '['}{low}, {high if high is not None else 'inf'})"
        raise ValueError(f"{owner}.{name} must lie in {bounds} and be finite, got {value}")


def _plain_numbers(instance: Any) -> None:
    """Stores every numeric field of a config as a plain `int` or `float` (bools stay).

    NumPy scalars pass the `numbers` checks, but JAX and `qat` refuse an
    `np.int64` step count or batch count (after FP32 training, for QAT) and
    `json` cannot write one into config.json at `save`.
    """
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if isinstance(value, bool) or type(value) in (int, float):
            continue
        if isinstance(value, numbers.Integral):
            object.__setattr__(instance, field.name, int(value))
        elif isinstance(value, numbers.Real):
            object.__setattr__(instance, field.name, float(value))


# FP32 training uses `seed` for its initial parameters, dropout keys and batch order;
# QAT uses `seed + 1` for all three, and the calibration batches' order `seed + 2`
# (tft_jax/forecaster/training.py). The streams overlap across seeds: a run of seed
# s + 1 trains FP32 on the batch order and dropout keys of seed s's QAT phase (a
# derivation kept, since changing it would change every seed's results). Without 64-bit
# mode `jax.random.key` keeps a seed's low 32 bits, so seeds 2**32 apart would train
# alike: every seed the runs use stays below 2**32.
MAX_SEED = 2**32 - 3


def _tuple_of_names(owner: str, name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        raise TypeError(f"{owner}.{name} must be a list of column names, got the string {value!r}")
    # None or a number would fail in `tuple` without the field's name.
    if not isinstance(value, Iterable):
        raise TypeError(
            f"{owner}.{name} must be a list of column names, got {type(value).__name__} {value!r}"
        )
    names = tuple(value)
    for item in names:
        if not isinstance(item, str):
            raise TypeError(
                f"{owner}.{name} must hold column names, got {item!r}"
                f"{_numbered_column_hint(name, item, [str(n) for n in names])}"
            )
    return names


def _numbered_column_hint(name: str, value: Any, texts: Any = None) -> str:
    """A hint for a column given by number (0): column names are texts, as the table's must be.

    A table whose columns are numbered (`pd.read_csv(header=None)`) has
    labels 0, 1, 2; a config names columns by text (it is saved as JSON and
    given on the command line), so the table's labels are made texts.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return ""
    given = repr(str(value)) if texts is None else repr(texts)
    return (
        f"; column names are texts: if the table's columns are numbered, make its labels "
        f"texts (df.columns = df.columns.astype(str)) and pass {name}={given}"
    )


def _read_time_text(name: str, text: str, time_format: str | None, dayfirst: bool) -> pd.Timestamp:
    """`text` read as the table's times are (`parse_time_text`); `ValueError` naming `name`.

    Checked when the config is made, not when a table is prepared with it
    (after reading the table, or in a run's config.json at load).
    """
    try:
        stamp = parse_time_text(text, time_format, dayfirst)
    except (ValueError, TypeError, OverflowError) as error:
        raise ValueError(
            f"{name} must be a time pandas reads (e.g. '2024-03-01'), got {text!r} ({error})"
        ) from None
    if pd.isna(stamp):
        raise ValueError(f"{name} must be a time, got {text!r} (not a time)")
    return stamp


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Which columns play which role, how the table is sampled, windowed and split.

    Attributes:
      id_col, time_col, target: the series id, time and target columns.
      freq: pandas offset alias of the sampling, e.g. 'h', 'D', 'MS'.
      static_cols, known_cols, observed_cols: real-valued inputs by role (see
        `tft_jax.data.TableSpec`); calendar inputs are generated from `freq`.
        Like `categorical_cols`, a list or any sequence of column names,
        stored as a tuple.
      timezone: IANA zone calendar inputs are read in (aware times only).
      history: T, steps of history per window (>= 2 with `window_normalization`).
      horizon: H, steps forecast per window.
      validation_fraction, test_fraction: shares of the time span at the end.
      validation_start, test_start: cut times instead of the fractions (both or neither).
      scaler: per-series target scaling, one of `TARGET_SCALERS`.
      train_stride: keep every n-th training window per series.
      season_period: the seasonal naive baseline's period in steps; None
        takes the frequency's (`tft_jax.baselines.seasonal_period`).
      categorical_cols: integer-coded inputs that are categorical (inputs
        holding text are categorical without being listed).
      time_format: strftime format of the time column; None infers it.
      dayfirst: read ambiguous dates such as 01/02/2024 as day first.
      encoding: text encoding of CSV files (None: UTF-8, pandas' default).
      max_missing_fraction: refuse a series whose missing target steps exceed
        this share of its time grid.
      min_series_length: leave out (with a warning) series shorter than this;
        those shorter than history + horizon are always left out.
      target_transform: 'none' or 'log1p' (counts, multiplicative growth),
        applied before the per-series scaler and inverted on the forecasts.
      window_normalization: scale each window by its own history's mean and
        std too (`WindowSet.normalized`), for series whose level moves. On
        by default: measured on public tables of several kinds (BENCHMARKS.md,
        "Forecast quality"), it helps much where levels move and costs little
        where they do not; the bundled pedestrian counts are better without.
      nonnegative: clip forecasts at 0 in original units (counts, quantities
        that cannot be negative). Off, forecasts below 0 of a table whose
        target is never below 0 are announced (`predict`, `evaluate`,
        `backtest`); read after training, so a fitted model takes it.
      require_observed_target: leave out of training, validation and scoring
        every window whose forecast horizon holds a filled target step (one
        missing from the table). False keeps those windows but the ones whose
        every forecast step is filled: their filled steps (`target_mask` 0)
        are left out of the training and validation loss and of every score
        (`evaluate`, `backtest`): a filled step leaves out
        up to `horizon` windows, so a table with a few scattered missing
        steps loses most of its windows by default. As `prepare_dataset`'s
        keyword of that name.
    """

    id_col: str
    time_col: str
    target: str
    freq: str
    static_cols: Sequence[str] = ()
    known_cols: Sequence[str] = ()
    observed_cols: Sequence[str] = ()
    timezone: str | None = None
    history: int = 168
    horizon: int = 24
    validation_fraction: float = 0.1
    test_fraction: float = 0.1
    validation_start: str | None = None
    test_start: str | None = None
    scaler: str = "standard"
    train_stride: int = 1
    season_period: int | None = None
    categorical_cols: Sequence[str] = ()
    time_format: str | None = None
    dayfirst: bool = False
    encoding: str = "utf-8"
    max_missing_fraction: float = 0.5
    min_series_length: int | None = None
    target_transform: str = "none"
    window_normalization: bool = True
    nonnegative: bool = False
    require_observed_target: bool = True

    def __post_init__(self) -> None:
        owner = "DataConfig"
        _plain_numbers(self)
        for name in ("static_cols", "known_cols", "observed_cols", "categorical_cols"):
            object.__setattr__(self, name, _tuple_of_names(owner, name, getattr(self, name)))
        for name in ("id_col", "time_col", "target", "freq"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                hint = _numbered_column_hint(name, value) if name != "freq" else ""
                raise TypeError(f"{owner}.{name} must be a non-empty string, got {value!r}{hint}")
        # pandas reads a number as a fixed offset in seconds (3 is UTC+00:00:03, not UTC+3),
        # and a tzinfo object cannot be written into config.json at `save`.
        if self.timezone is not None and not isinstance(self.timezone, str):
            raise TypeError(
                f"{owner}.timezone must be an IANA zone name such as 'Europe/Paris' or None, "
                f"got {type(self.timezone).__name__} {self.timezone!r}"
            )
        self.table_spec()  # roles, frequency and timezone are checked there
        _require_int(owner, "history", self.history, 1)
        if isinstance(self.window_normalization, bool):  # else refused as a non-bool below
            check_normalized_history(self.history, self.window_normalization, f"{owner}.")
        _require_int(owner, "horizon", self.horizon, 1)
        _require_int(owner, "train_stride", self.train_stride, 1)
        _require_int(owner, "season_period", self.season_period, 1, optional=True)
        _require_int(owner, "min_series_length", self.min_series_length, 1, optional=True)
        _require_float(owner, "max_missing_fraction", self.max_missing_fraction, 0.0,
                       open_low=False)  # fmt: skip
        if self.max_missing_fraction > 1.0:  # a fraction: 1 (every step filled) included
            raise ValueError(
                f"{owner}.max_missing_fraction must lie in [0.0, 1.0], got "
                f"{self.max_missing_fraction}"
            )
        for name in ("time_format", "encoding"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{owner}.{name} must be a string or None, got {value!r}")
        if self.encoding is None:  # pandas' default, named: the readers and run folders take a name
            object.__setattr__(self, "encoding", "utf-8")
        else:
            try:  # refused here, not once the table is read
                codecs.lookup(self.encoding)
            except LookupError:
                raise ValueError(
                    f"{owner}.encoding {self.encoding!r} is not a text encoding Python knows "
                    "(e.g. 'utf-8', 'latin-1', 'cp1252')"
                ) from None
        switches = ("dayfirst", "window_normalization", "nonnegative", "require_observed_target")
        for name in switches:
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{owner}.{name} must be a bool, got {getattr(self, name)!r}")
        if self.target_transform not in TARGET_TRANSFORMS:
            raise ValueError(
                f"{owner}.target_transform must be one of {TARGET_TRANSFORMS}, got "
                f"{self.target_transform!r}"
            )
        for name in ("validation_fraction", "test_fraction"):
            _require_float(owner, name, getattr(self, name), 0.0, 1.0, open_low=False)
        if self.validation_fraction + self.test_fraction >= 1.0:
            raise ValueError(
                f"{owner}.validation_fraction + test_fraction must be < 1, got "
                f"{self.validation_fraction} + {self.test_fraction}"
            )
        if (self.validation_start is None) != (self.test_start is None):
            raise ValueError(
                f"{owner}: give both validation_start and test_start, or neither (fractions)"
            )
        cuts = []
        for name in ("validation_start", "test_start"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, str(value))
                cuts.append(
                    _read_time_text(f"{owner}.{name}", str(value), self.time_format, self.dayfirst)
                )
        # Cuts of which one names a zone are compared once the table's zone is known.
        if len(cuts) == 2 and (cuts[0].tz is None) == (cuts[1].tz is None) and cuts[0] > cuts[1]:
            raise ValueError(
                f"{owner}.validation_start ({self.validation_start}) must not be after "
                f"{owner}.test_start ({self.test_start}): validation comes before the test"
            )
        if self.scaler not in TARGET_SCALERS:
            raise ValueError(f"{owner}.scaler must be one of {TARGET_SCALERS}, got {self.scaler!r}")

    def table_spec(self) -> TableSpec:
        """The column roles and sampling as a `TableSpec`."""
        return TableSpec(
            id_col=self.id_col,
            time_col=self.time_col,
            target=self.target,
            # Tuples already (`__post_init__`); `tuple` gives the checker the stored type.
            static_cols=tuple(self.static_cols),
            known_cols=tuple(self.known_cols),
            observed_cols=tuple(self.observed_cols),
            freq=self.freq,
            timezone=self.timezone,
            categorical_cols=tuple(self.categorical_cols),
            time_format=self.time_format,
            dayfirst=self.dayfirst,
        )

    def prepare_options(self) -> dict[str, Any]:
        """The keywords of `tft_jax.data.prepare_dataset` these settings give."""
        return {
            **dataclasses.asdict(self.table_spec()),
            "history": self.history,
            "horizon": self.horizon,
            "validation_fraction": self.validation_fraction,
            "test_fraction": self.test_fraction,
            "validation_start": self.validation_start,
            "test_start": self.test_start,
            "scaler": self.scaler,
            "train_stride": self.train_stride,
            "encoding": self.encoding,
            "max_missing_fraction": self.max_missing_fraction,
            "min_series_length": self.min_series_length,
            "target_transform": self.target_transform,
            "window_normalization": self.window_normalization,
            "require_observed_target": self.require_observed_target,
        }

    @classmethod
    def pedestrian(cls, **overrides: Any) -> DataConfig:
        """The bundled Melbourne pedestrian counts (`tft_jax.data.load_pedestrian`)."""
        return cls(**{**PEDESTRIAN_SPEC, **overrides})


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The TFT's size and quantiles; the data fills in the input counts (`TFTConfig`).

    Attributes:
      hidden_dim: model width D, >= 3 (`tft_jax.config.MIN_HIDDEN_DIM`).
      num_heads: attention heads, dividing `hidden_dim`.
      dropout_rate: dropout probability.
      variable_hidden_dim: width of each input variable's GRN; None = `hidden_dim`.
      compact_selection: selection GRNs of width min(hidden_dim, V) (pytorch-forecasting).
      quantiles: increasing levels in (0, 1), including 0.5 and 0.9 (the
        metrics report P50 and P90 q-risk); a list or any sequence, stored as
        a tuple of floats.
    """

    hidden_dim: int = 32
    num_heads: int = 4
    dropout_rate: float = 0.1
    variable_hidden_dim: int | None = None
    compact_selection: bool = False
    quantiles: Sequence[float] = (0.1, 0.5, 0.9)

    def __post_init__(self) -> None:
        owner = "ModelConfig"
        _plain_numbers(self)
        _require_int(owner, "hidden_dim", self.hidden_dim, 1)
        check_hidden_dim(self.hidden_dim, owner)
        _require_int(owner, "num_heads", self.num_heads, 1)
        _require_int(owner, "variable_hidden_dim", self.variable_hidden_dim, 1, optional=True)
        _require_float(owner, "dropout_rate", self.dropout_rate, 0.0, 1.0, open_low=False)
        if self.hidden_dim % self.num_heads:
            raise ValueError(
                f"{owner}.hidden_dim ({self.hidden_dim}) must be divisible by "
                f"{owner}.num_heads ({self.num_heads})"
            )
        if not isinstance(self.compact_selection, bool):
            raise TypeError(
                f"{owner}.compact_selection must be a bool, got {self.compact_selection!r}"
            )
        # A bare number, a string or None would fail in `tuple`/`float` without the field's name.
        if isinstance(self.quantiles, str | bytes) or not isinstance(self.quantiles, Iterable):
            raise TypeError(
                f"{owner}.quantiles must be a sequence of levels such as (0.1, 0.5, 0.9), got "
                f"{type(self.quantiles).__name__} {self.quantiles!r}"
            )
        for q in self.quantiles:
            if isinstance(q, bool) or not isinstance(q, numbers.Real):
                raise TypeError(
                    f"{owner}.quantiles must hold numbers, got {type(q).__name__} {q!r}"
                )
        levels = tuple(float(q) for q in self.quantiles)
        object.__setattr__(self, "quantiles", levels)
        if any(not 0.0 < q < 1.0 for q in levels) or sorted(set(levels)) != list(levels):
            raise ValueError(f"{owner}.quantiles must be increasing levels in (0, 1), got {levels}")
        if 0.5 not in levels or 0.9 not in levels:
            raise ValueError(
                f"{owner}.quantiles must include 0.5 and 0.9 (metrics report P50 and P90 "
                f"q-risk), got {levels}"
            )
        # Levels equal to 6 significant digits share a forecast column (and a metrics key):
        # predict would write the second over the first and return one column fewer.
        names = [quantile_name(level) for level in levels]
        shared = sorted(repeated(names))
        if shared:
            clashing = [level for level, name in zip(levels, names, strict=True) if name in shared]
            raise ValueError(
                f"{owner}.quantiles {levels} name the forecast columns {names}: levels "
                f"{clashing} share the columns {shared}; give levels that differ within 6 "
                "significant digits"
            )


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """FP32 training: AdamW after `clip_by_global_norm`, linear warmup then cosine decay.

    Attributes:
      epochs: passes over the training windows.
      max_steps: stop after this many steps (None: the epochs decide).
      time_budget: stop training after this many seconds, counted from the
        start of training with the compilation included (None: no limit);
        the learning-rate schedule is fitted to the steps it allows, and the
        final evaluation and checkpoint follow (`tft_jax.train.fit`). Three
        minutes by default, so that a default run on a laptop-sized table
        (training, QAT, evaluation) ends in minutes.
      batch_size: the global batch, divisible by the device count.
      learning_rate: peak learning rate.
      warmup_steps: linear warmup steps; None = 5% of the steps, at most 200.
      clip_norm: `clip_by_global_norm` threshold; None disables clipping.
      weight_decay: AdamW weight decay.
      patience: early stopping after this many evaluations without improvement.
      eval_every: steps between validation evaluations (None: once per epoch).
      validation_windows: validation windows per evaluation, evenly spaced;
        at least `batch_size`, rounded down to whole batches of `batch_size`.
      seed: random seed, 0..`MAX_SEED` (2**32 - 3: QAT and calibration use
        seed + 1 and seed + 2, and JAX keys keep a seed's low 32 bits). FP32
        training draws its initial parameters, dropout and batch order from
        `seed`, QAT from `seed + 1`, the calibration batches' order from
        `seed + 2`: seed s + 1's FP32 phase shares the streams of seed s's QAT
        phase, so runs of neighbouring seeds are not independent there.
      eval_batch_size: windows per batch when predicting, and when validating
        if it divides over the devices (one compiled forward serves both).
    """

    epochs: int = 10
    max_steps: int | None = None
    time_budget: float | None = 180.0
    batch_size: int = 64
    learning_rate: float = 1e-3
    warmup_steps: int | None = None
    clip_norm: float | None = 1.0
    weight_decay: float = 0.0
    patience: int | None = None
    eval_every: int | None = None
    validation_windows: int = 2048
    seed: int = 0
    eval_batch_size: int = 256

    def __post_init__(self) -> None:
        owner = "TrainingConfig"
        _plain_numbers(self)
        _require_int(owner, "epochs", self.epochs, 1)
        _require_int(owner, "max_steps", self.max_steps, 1, optional=True)
        if self.time_budget is not None:
            _require_float(owner, "time_budget", self.time_budget, 0.0)
        _require_int(owner, "batch_size", self.batch_size, 1)
        _require_float(owner, "learning_rate", self.learning_rate, 0.0)
        _require_int(owner, "warmup_steps", self.warmup_steps, 0, optional=True)
        if self.clip_norm is not None:
            _require_float(owner, "clip_norm", self.clip_norm, 0.0)
        _require_float(owner, "weight_decay", self.weight_decay, 0.0, open_low=False)
        _require_int(owner, "patience", self.patience, 1, optional=True)
        _require_int(owner, "eval_every", self.eval_every, 1, optional=True)
        _require_int(owner, "validation_windows", self.validation_windows, 1)
        _require_int(owner, "seed", self.seed, 0)
        if self.seed > MAX_SEED:
            raise ValueError(
                f"{owner}.seed must be <= {MAX_SEED} (2**32 - 3: JAX keys keep a seed's low "
                f"32 bits), got {self.seed}"
            )
        _require_int(owner, "eval_batch_size", self.eval_batch_size, 1)
        # Validation runs in whole batches of `batch_size`: fewer windows than one batch
        # would evaluate a whole batch, more than were asked for.
        if self.validation_windows < self.batch_size:
            raise ValueError(
                f"{owner}.validation_windows must be >= {owner}.batch_size ({self.batch_size}): "
                f"validation runs in whole batches, got {self.validation_windows}"
            )
        # The learning rate warms up over `warmup_steps` of at most `max_steps`; checked
        # here, not after the table is read (without max_steps the data sets the total).
        if (
            self.warmup_steps is not None
            and self.max_steps is not None
            and self.warmup_steps >= self.max_steps
        ):
            raise ValueError(
                f"{owner}.warmup_steps ({self.warmup_steps}) must be below "
                f"{owner}.max_steps ({self.max_steps})"
            )


@dataclasses.dataclass(frozen=True)
class QATTrainingConfig:
    """Quantization-aware fine-tuning of the trained FP32 model, then int8 conversion.

    Attributes:
      bits: integer width (2..8) of weights and activations.
      steps: QAT fine-tuning steps.
      learning_rate: peak QAT learning rate.
      calibration_batches: training batches the activation observers see first.
      observer_steps: first QAT steps during which the observers keep updating.
      time_budget: stop fine-tuning after this many seconds, compilation
        included, with the schedule fitted to it as in FP32 training (None:
        `steps` alone). One minute by default: with the FP32 budget, a
        default run stays within minutes.

    NumPy integers are taken for the integer fields, stored as Python ints.
    """

    bits: int = 8
    steps: int | np.integer = 300
    learning_rate: float = 1e-4
    calibration_batches: int | np.integer = 50
    observer_steps: int = 0
    time_budget: float | None = 60.0

    def __post_init__(self) -> None:
        owner = "QATTrainingConfig"
        _plain_numbers(self)
        if self.time_budget is not None:
            _require_float(owner, "time_budget", self.time_budget, 0.0)
        _require_int(owner, "bits", self.bits, 2)
        if self.bits > 8:
            raise ValueError(f"{owner}.bits must be in 2..8, got {self.bits}")
        _require_int(owner, "steps", self.steps, 1)
        _require_float(owner, "learning_rate", self.learning_rate, 0.0)
        _require_int(owner, "calibration_batches", self.calibration_batches, 1)
        _require_int(owner, "observer_steps", self.observer_steps, 0)


def quantile_name(level: float) -> str:
    """The column of a quantile level in `predict`'s output: 0.1 -> 'q0.1'."""
    return f"q{float(level):g}"


def another_class_hint(value: Any, kind: type) -> str:
    """Why `value` is not a `kind` although its class has that name: a class of another
    import of the module (a notebook's `importlib.reload`, say), or '' when the names
    differ. "must be a DataConfig, got DataConfig" said nothing."""
    other = type(value)
    if other is kind or other.__name__ != kind.__name__:
        return ""
    return (
        f" (two imports of {other.__module__}'s {other.__name__}: a module reloaded with "
        "importlib.reload makes new classes the modules importing it do not know; restart "
        "the interpreter, or reload those modules too)"
    )


@dataclasses.dataclass(frozen=True)
class ForecasterConfig:
    """All settings of a `Forecaster`; `qat=None` trains FP32 only."""

    data: DataConfig
    model: ModelConfig = ModelConfig()
    training: TrainingConfig = TrainingConfig()
    qat: QATTrainingConfig | None = None

    def __post_init__(self) -> None:
        # A wrong section (a dict, say) would fail later, in an attribute read or in training.
        sections = (("data", DataConfig), ("model", ModelConfig), ("training", TrainingConfig))
        for name, kind in (*sections, ("qat", QATTrainingConfig)):
            value = getattr(self, name)
            if not isinstance(value, kind) and not (name == "qat" and value is None):
                optional = " or None" if name == "qat" else ""
                raise TypeError(
                    f"{name} must be a {kind.__name__}{optional}, got {type(value).__name__} "
                    f"{value!r}{another_class_hint(value, kind)}"
                )
        # `predict` writes the id, the time and one column per quantile level.
        outputs = {quantile_name(level) for level in self.model.quantiles}
        for name in ("id_col", "time_col"):
            column = getattr(self.data, name)
            if column in outputs:
                raise ValueError(
                    f"DataConfig.{name} {column!r} is also the name of a quantile column of "
                    f"predict's output ({sorted(outputs)}); rename the column"
                )

    @property
    def integer_bits(self) -> int:
        """The width of the integer ('int8') model's codes: `qat.bits`, 8 without QAT."""
        return self.qat.bits if self.qat is not None else 8

    def to_json(self) -> dict[str, Any]:
        """`dataclasses.asdict` of every section (tuples as lists once serialised)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ForecasterConfig:
        """The config `to_json` wrote."""
        return cls(
            data=DataConfig(**data["data"]),
            model=ModelConfig(**data["model"]),
            training=TrainingConfig(**data["training"]),
            qat=None if data.get("qat") is None else QATTrainingConfig(**data["qat"]),
        )


# The sections of a `ForecasterConfig` (and of its `to_json`), by field name.
SECTIONS: dict[str, type[DataclassInstance]] = {
    "data": DataConfig,
    "model": ModelConfig,
    "training": TrainingConfig,
    "qat": QATTrainingConfig,
}


def field_default(config: type[DataclassInstance], name: str) -> Any:
    """The default of field `name` of a config dataclass (for argparse defaults and help)."""
    field = config.__dataclass_fields__[name]
    if field.default is dataclasses.MISSING:
        raise KeyError(f"{config.__name__}.{name} has no default")
    return field.default


# The demo: the whole pipeline on the bundled pedestrian counts in minutes on two CPU cores.
DEMO = ForecasterConfig(
    # Pedestrian counts keep their level: the per-series scaler alone forecasts them
    # better than with window normalization (BENCHMARKS.md, "Forecast quality"). Counts
    # cannot be negative: the forecasts are clipped at 0 (unclipped, some low quantiles go
    # below 0, and `evaluate` would say so; README.md has the figures).
    data=DataConfig.pedestrian(
        history=72, horizon=24, window_normalization=False, nonnegative=True
    ),
    model=ModelConfig(hidden_dim=32, num_heads=4, dropout_rate=0.1, variable_hidden_dim=8),
    training=TrainingConfig(
        epochs=100,
        max_steps=1200,
        time_budget=None,
        batch_size=64,
        learning_rate=3e-3,
        eval_every=200,
        patience=4,
        validation_windows=1024,
    ),
    qat=QATTrainingConfig(steps=300, learning_rate=3e-4, calibration_batches=50, time_budget=None),
)
