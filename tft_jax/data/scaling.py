"""Affine scalers fitted on the training period: per-series for the target, per-column for inputs.

Both map `x -> (x - loc) / scale`. A scale that is zero, not finite, or below
`NEGLIGIBLE_SPREAD · |loc|` (a constant series or column, up to float64
rounding) is replaced, so a constant is centred but never divided by ~0: for
an input column by 1; for a series' target by its level `|loc|` (1 where the
level is 0), announced by a warning naming the series. A scale of 1 is in the
target's units: a series constant at a tiny level would be forecast in a band
orders of magnitude wider than it, one at a huge level in a band of a few
units. The test
is relative only: a series that varies at a small magnitude (values around
1e-9) keeps its own scale, since a scale of 1 would leave it near 0 in model
units and its forecasts off by orders of magnitude. The robust scale of a
series that is not constant but mostly one value (intermittent demand: an
interquartile range of 0) is its mean absolute deviation from the median
instead, announced by a warning: a scale of 1 would leave its spikes unscaled.

A few values far from all the others of a series (a 1e30 typed among
hundreds) set its 'standard' or 'mean_abs' scale: every other value then
scales to about 0 and the forecasts come back off by orders of magnitude.
Such values are named in a warning that suggests `scaler='robust'`
(`extreme_values`): a series is flagged when its largest deviations from its
median exceed `OUTLIER_GAP` times its `OUTLIER_SHARE`-quantile-from-the-top
deviation (a gap that trends, seasons and intermittent spikes do not open,
and ordinary heavy tails rarely do), and its scale without them is under
`1 / OUTLIER_INFLATION` of its scale with them.

`FeatureScaler` also keeps each input column's training minimum and maximum,
so that a value far outside them (`FeatureScaler.far_outside`), or any other
value of a column that was constant in training, can be announced where it
enters a forecast.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from tft_jax.caller_frame import user_stacklevel
from tft_jax.data.listing import first_few

TARGET_SCALERS = ("standard", "robust", "mean_abs", "none")
# A spread below this fraction of the level is float64 rounding of a constant (the
# statistics of identical values are off by a few 1e-16 of it), with a wide margin;
# real variation above it is scaled: a meter at 4.2e9 varying by 31 is no constant.
NEGLIGIBLE_SPREAD = 1e-12
# A series' few extreme values (at most this share of them, at least one) are those more
# than OUTLIER_GAP times farther from its median than all but that share of its values, and
# flagged when they make its scale over OUTLIER_INFLATION times what it is without them.
# A trend, a season or intermittent spikes open no such gap; a very heavy tail (Cauchy,
# Pareto with alpha <= 1) now and then does, and then one value does set the scale.
OUTLIER_SHARE = 0.05
OUTLIER_GAP = 1e3
OUTLIER_INFLATION = 10.0
# Monotone maps applied to the target before scaling and inverted after: quantiles commute.
TARGET_TRANSFORMS = ("none", "log1p")


def check_domain(
    values: np.ndarray,
    codes: np.ndarray,
    transform: str,
    series_names: Sequence[object] | None = None,
    times: Sequence[object] | None = None,
    fitted: bool = False,
) -> None:
    """Raises naming the series, time and value when `values` leave the transform's domain.

    `times`: the time of each value (named when given). `fitted`: the
    transform is a fitted model's, which the table must fit (the advice is
    then to fix the rows, not to change the transform).
    """
    if transform != "log1p":
        return
    bad = values <= -1.0
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        code = int(codes[row])
        name = series_names[code] if series_names is not None else code
        at = "" if times is None else f" at {times[row]}"
        advice = (
            "the model was fitted with target_transform='log1p': fix or drop those rows"
            if fitted
            else "fix those rows, or use target_transform='none'"
        )
        raise ValueError(
            f"target_transform='log1p' needs targets > -1, but series {name!r} has "
            f"{values[row]}{at} ({int(bad.sum())} such values); {advice}"
        )


def forward_transform(values: np.ndarray, transform: str) -> np.ndarray:
    """`values` through the target transform (`log1p` needs values > -1; NaN passes)."""
    if transform == "log1p":
        return np.log1p(values)
    return values


def inverse_transform_values(values: np.ndarray, transform: str) -> np.ndarray:
    """The inverse of `forward_transform`."""
    if transform == "log1p":
        return np.expm1(values)
    return values


def _negligible(scale: float, loc: float) -> bool:
    """Whether `scale` is too small (or not finite) to divide by at location `loc`.

    Relative to `|loc|` (rounding noise of a constant, `NEGLIGIBLE_SPREAD`),
    never an absolute floor such as 1e-8: that would call every series of
    small magnitude constant.
    """
    tiny = np.finfo(np.float64).tiny  # zero or subnormal: nothing to divide by
    return not np.isfinite(scale) or scale <= max(NEGLIGIBLE_SPREAD * abs(loc), tiny)


class TargetStatistics(NamedTuple):
    """One series' fitted target location and scale, and which fallback gave the scale.

    Attributes:
      loc: the location.
      scale: the scale, positive.
      spread_fallback: the robust scale is the mean absolute deviation from
        the median (an interquartile range of 0).
      constant: the series is constant (its spread is negligible): the scale
        is its level (`level_scale`).
    """

    loc: float
    scale: float
    spread_fallback: bool
    constant: bool


def level_scale(loc: float) -> float:
    """The scale of a constant series at location `loc`: `|loc|`, or 1 where that is 0.

    Relative to the level, so a forecast band around a constant is as wide
    against it at 3e-9 as at 3e9; a level of 0 (or one too small or large
    to divide by) has no size to go by, and 1 is as good as any.
    """
    level = abs(loc)
    return level if np.isfinite(level) and level > np.finfo(np.float64).tiny else 1.0


def _peak_power_of_two(values: np.ndarray) -> float:
    """A power of two near the largest magnitude of `values` (1 where it is 0 or not finite)."""
    peak = float(np.max(np.abs(values)))
    return float(np.ldexp(1.0, int(np.frexp(peak)[1]) - 1)) if 0.0 < peak < np.inf else 1.0


def _statistics(values: np.ndarray, method: str) -> tuple[float, float, bool]:
    """`(loc, spread, spread_fallback)` of a 1-D array with no NaN, by `method`.

    The spread may be negligible (`_negligible`): the callers replace it. The
    statistics are computed on `values` divided by a power of two near their
    largest magnitude, then multiplied back: exact (a power of two only moves
    exponents), but sums and squares no longer overflow, so values around
    1e200 get their own scale instead of an infinite one replaced.
    """
    if values.size == 0:
        raise ValueError("cannot fit a scaler on no values")
    factor = _peak_power_of_two(values)
    values = values / factor
    fallback = False
    if method == "standard":
        loc, scale = float(np.mean(values)), float(np.std(values))
    elif method == "robust":
        q25, q50, q75 = np.quantile(values, (0.25, 0.5, 0.75))
        loc, scale = float(q50), float(q75 - q25)
        if _negligible(scale, loc):
            spread = float(np.mean(np.abs(values - loc)))
            fallback = not _negligible(spread, loc)
            scale = spread if fallback else scale
    elif method == "mean_abs":
        loc, scale = 0.0, float(np.mean(np.abs(values)))
    else:
        return 0.0, 1.0, False
    return loc * factor, scale * factor, fallback


def target_statistics(values: np.ndarray, method: str) -> TargetStatistics:
    """A series' target location and scale from its values (1-D, no NaN), by `method`.

    The scale of a constant series is its level (`level_scale`).
    """
    loc, spread, fallback = _statistics(values, method)
    if _negligible(spread, loc):
        return TargetStatistics(loc, level_scale(loc), fallback, True)
    return TargetStatistics(loc, spread, fallback, False)


def extreme_values(values: np.ndarray, method: str) -> np.ndarray:
    """The positions of the few values of a series (1-D, no NaN) that set its `method` scale.

    Only 'standard' and 'mean_abs' scales are moved by a single value; the
    median and interquartile range of 'robust' are not. With `few` =
    `max(1, floor(OUTLIER_SHARE * n))` and `bulk` the `(few + 1)`-th largest
    absolute deviation from the median, the extreme values are those whose
    deviation is above `OUTLIER_GAP * bulk`; they are returned when the
    scale of the other values is below `1 / OUTLIER_INFLATION` of the
    scale of all. A series whose values but a few are all one value (`bulk`
    0: intermittent demand with a sale or two) has no spread to compare
    against and returns none.

    Returns:
      (E,) int positions in `values`, ascending; empty when there are none.
    """
    none = np.zeros(0, dtype=np.int64)
    count = values.size
    few = max(1, int(OUTLIER_SHARE * count))
    if method not in ("standard", "mean_abs") or count <= few:
        return none
    scaled = values / _peak_power_of_two(values)  # deviations of +-1e308 do not overflow
    deviation = np.abs(scaled - np.median(scaled))
    bulk = float(np.partition(deviation, count - few - 1)[count - few - 1])
    if not 0.0 < bulk < np.inf:
        return none
    extreme = np.flatnonzero(deviation > OUTLIER_GAP * bulk)
    if extreme.size == 0:
        return none
    _, spread, _ = _statistics(scaled, method)
    _, rest, _ = _statistics(np.delete(scaled, extreme), method)
    return extreme if spread > OUTLIER_INFLATION * rest else none


class ExtremeSeries(NamedTuple):
    """A series whose scale a few extreme values set, as `announce_extreme_values` names it.

    Attributes:
      name: the series.
      place: where the first extreme value is (its time, or its position).
      value: that value, in the target's units.
      count: how many extreme values the series has.
      scale: the series' fitted scale, with them.
      rest: its scale without them.
    """

    name: object
    place: str
    value: float
    count: int  # type: ignore[assignment]  # the field replaces tuple.count
    scale: float
    rest: float


def extreme_series(
    name: object, values: np.ndarray, scale: float, method: str, transform: str
) -> tuple[int, ExtremeSeries] | None:
    """`(first, extreme)` when a few of one series' values set its `method` scale, else None.

    `values` are the series' observed values after `transform` (1-D, no NaN),
    fitted to `scale`; `first` is the position among them of the first
    extreme value, and `extreme.place` is left empty for the caller, who
    knows where that value is (its time, or its row).
    """
    extreme = extreme_values(values, method)
    if not extreme.size:
        return None
    first = int(extreme[0])
    rest = target_statistics(np.delete(values, extreme), method).scale
    value = float(inverse_transform_values(values[first], transform))
    return first, ExtremeSeries(name, "", value, int(extreme.size), scale, rest)


def announce_extreme_values(extremes: Sequence[ExtremeSeries], method: str, period: str) -> None:
    """Warns that a few values set the `method` scale of the series `extremes`.

    One warning for all of them, naming the first few with the first such
    value, its time and the scale with and without those values; silent when
    `extremes` is empty.
    """
    if not extremes:
        return
    shown = first_few(
        [
            f"{e.name!r} {e.value:.6g} {e.place}"
            + (f" (and {e.count - 1} more such value{'s' * (e.count > 2)})" if e.count > 1 else "")
            + f": scale {e.scale:.4g}, {e.rest:.4g} without {'them' if e.count > 1 else 'it'}"
            for e in extremes
        ],
        separator="; ",
    )
    warnings.warn(
        f"scaler={method!r}: {len(extremes)} series have a few values in {period} more than "
        f"{OUTLIER_GAP:g} times farther from their median than all but their "
        f"{100 * OUTLIER_SHARE:g}% most distant values, which set their scale: {shown}; every "
        "other value of those series scales to about 0, "
        "so their forecasts can be off by orders of magnitude. Fix or drop those values if they "
        "are errors, or fit with scaler='robust' (--scaler robust), "
        "whose median and interquartile range they do not move",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


def _shown(names: Sequence[object]) -> str:
    """The first five of `names` and how many more, for a warning."""
    return first_few([repr(name) for name in names])


def announce_spread_fallbacks(names: Sequence[object], period: str) -> None:
    """Warns that the robust scale of the series `names` is their mean absolute deviation.

    `period` names the values they were fitted on ('the training period');
    silent when `names` is empty.
    """
    if not names:
        return
    warnings.warn(
        f"scaler='robust': {len(names)} series have an interquartile range of 0 in {period} "
        f"(mostly one value, e.g. intermittent demand): {_shown(names)}; their scale is the "
        "mean absolute deviation from the median instead",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


def announce_constant_series(names: Sequence[object], period: str) -> None:
    """Warns that the series `names` are constant in `period`, so scaled by their level.

    A constant has no spread to scale by: its forecasts' spread is then a
    share of its level, learnt from the other series. Silent when `names`
    is empty.
    """
    if not names:
        return
    warnings.warn(
        f"{len(names)} series are constant in {period}: {_shown(names)}; each is centred "
        "on its value and scaled by its size |value| (by 1 where the value is 0), so its "
        "forecast spread is relative to its level",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


def _location_scale(values: np.ndarray, method: str) -> tuple[float, float]:
    """An input column's location and scale (see the module docstring): 1 if constant."""
    loc, scale, _ = _statistics(values, method)
    return loc, 1.0 if _negligible(scale, loc) else scale


def _check_codes(codes: npt.ArrayLike, leading: int, num_series: int) -> np.ndarray:
    codes = np.asarray(codes)
    if codes.ndim != 1 or codes.shape[0] != leading:
        raise ValueError(
            f"series_code must have shape ({leading},) to match values, got {codes.shape}"
        )
    if not np.issubdtype(codes.dtype, np.integer):
        raise TypeError(f"series_code must hold integers, got dtype {codes.dtype}")
    if codes.size and (codes.min() < 0 or codes.max() >= num_series):
        raise ValueError(
            f"series_code values must lie in [0, {num_series}), got range "
            f"[{codes.min()}, {codes.max()}]"
        )
    return codes


@dataclasses.dataclass(frozen=True, eq=False)
class TargetScaler:
    """Per-series affine scaling of the target, `scaled = (y - loc[code]) / scale[code]`.

    Methods: 'standard' (mean, population std), 'robust' (median,
    interquartile range; the mean absolute deviation from the median, with a
    warning, for a series whose interquartile range is 0), 'mean_abs' (0, mean
    of |y|), 'none' (0, 1). A constant series is scaled by its level, with a
    warning (`level_scale`). With `target_transform='log1p'` the target is
    `log1p(y)` before scaling (for counts and series whose level grows
    multiplicatively) and `expm1` after the inverse, so forecasts in original
    units stay above -1.

    Attributes:
      loc: (num_series,) float64 location per series code (transformed units).
      scale: (num_series,) float64 positive scale per series code.
      method: the method the scaler was fitted with.
      target_transform: one of `TARGET_TRANSFORMS`.
    """

    loc: np.ndarray
    scale: np.ndarray
    method: str
    target_transform: str = "none"

    @classmethod
    def fit(
        cls,
        values: np.ndarray,
        codes: np.ndarray,
        num_series: int,
        method: str = "standard",
        series_names: Sequence[object] | None = None,
        transform: str = "none",
        times: Sequence[object] | None = None,
    ) -> TargetScaler:
        """Fits one location and scale per series from `values`, ignoring NaN.

        A series whose 'standard' or 'mean_abs' scale is set by a few extreme
        values (`extreme_values`) is named in a warning with the first of
        them, suggesting `scaler='robust'`.

        Args:
          values: (R,) target values; only the rows to fit on (the training
            period), NaN where missing.
          codes: (R,) int series code of each value, in [0, num_series).
          num_series: number of series.
          method: one of `TARGET_SCALERS`.
          series_names: names for error messages, indexed by code.
          transform: one of `TARGET_TRANSFORMS`, applied before fitting.
          times: (R,) the time of each value, named by the warning of extreme
            values; None: they are named by their position among the
            series' values.

        Raises:
          ValueError: for an unknown method or transform, a series without any
            value, or a value outside the transform's domain.
        """
        if method not in TARGET_SCALERS:
            raise ValueError(f"scaler must be one of {TARGET_SCALERS}, got {method!r}")
        if transform not in TARGET_TRANSFORMS:
            raise ValueError(
                f"target_transform must be one of {TARGET_TRANSFORMS}, got {transform!r}"
            )
        values = np.asarray(values, dtype=np.float64)
        codes = _check_codes(codes, values.shape[0], num_series)
        check_domain(values, codes, transform, series_names)
        if times is not None and len(times) != values.shape[0]:
            raise ValueError(f"times must have one entry per value ({values.shape[0]}), got "
                             f"{len(times)}")  # fmt: skip
        values = forward_transform(values, transform)
        rows = np.arange(values.shape[0])
        # Each series' values as one slice, in their given order (a stable sort by code):
        # one pass over the rows, where masking the rows of every series was series x rows.
        if (codes[1:] < codes[:-1]).any():
            order = np.argsort(codes, kind="stable")
            values, codes, rows = values[order], codes[order], rows[order]
        bounds = np.searchsorted(codes, np.arange(num_series + 1))
        loc, scale = np.zeros(num_series), np.ones(num_series)
        spread_fallbacks: list[object] = []
        constants: list[object] = []
        extremes: list[ExtremeSeries] = []
        for code in range(num_series):
            name = series_names[code] if series_names is not None else code
            series_values = values[bounds[code] : bounds[code + 1]]
            present = ~np.isnan(series_values)
            series_values = series_values[present]
            if series_values.size == 0:
                raise ValueError(
                    f"series {name!r} has no observed target in the training period, so its "
                    "scaler cannot be fitted there; move the validation start later or drop "
                    "that series"
                )
            loc[code], scale[code], fallback, constant = target_statistics(series_values, method)
            if fallback:
                spread_fallbacks.append(name)
            if constant:
                constants.append(name)
                continue
            found = extreme_series(name, series_values, float(scale[code]), method, transform)
            if found is not None:
                first, extreme = found
                position = int(np.flatnonzero(present)[first])  # among the series' rows
                row = int(rows[bounds[code] + position])
                place = (
                    f"at {times[row]}" if times is not None
                    else f"at position {position} of its values"
                )  # fmt: skip
                extremes.append(extreme._replace(place=place))
        announce_spread_fallbacks(spread_fallbacks, "the training period")
        announce_constant_series(constants, "the training period")
        announce_extreme_values(extremes, method, "the training period")
        return cls(loc=loc, scale=scale, method=method, target_transform=transform)

    @property
    def num_series(self) -> int:
        """Number of series the scaler covers."""
        return int(self.loc.shape[0])

    def _broadcast(self, values: np.ndarray, codes: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        if values.ndim == 0:
            raise ValueError("values must have a leading batch axis (B, ...), got a scalar")
        codes = _check_codes(codes, values.shape[0], self.num_series)
        trailing = (1,) * (values.ndim - 1)
        return self.loc[codes].reshape(-1, *trailing), self.scale[codes].reshape(-1, *trailing)

    def transform(self, values: np.ndarray, series_code: np.ndarray) -> np.ndarray:
        """Scales `values` (B, ...) of the series `series_code` (B,); returns float64."""
        values = forward_transform(np.asarray(values, dtype=np.float64), self.target_transform)
        loc, scale = self._broadcast(values, series_code)
        return (values - loc) / scale

    def inverse_transform(
        self,
        values: npt.ArrayLike,
        series_code: npt.ArrayLike,
        where: Callable[[tuple[int, ...]], str] | None = None,
    ) -> np.ndarray:
        """Maps scaled `values` (B, ...), e.g. forecasts (B, H, Q), back to the target's units.

        A finite value whose image is beyond float64 (`expm1` above ~709.8 in
        log1p units, or a huge value times a huge scale) is refused, not
        returned as inf: no target the scaler was fitted on is near it, so it
        is a broken forecast, and an inf scores as an inf q-risk that
        metrics.json writes as null.

        Args:
          values: (B, ...) scaled values; any trailing shape. Any array
            (a JAX array: the model's output) or nested sequence.
          series_code: (B,) int series code of each row, as an array or sequence.
          where: optional description of an element for the error message,
            from its index (e.g. "the forecast of series 'a' at 2024-01-01");
            default: its series code and index.

        Returns:
          (B, ...) float64 `values * scale[code] + loc[code]` (then `expm1`
          with `target_transform='log1p'`); NaN stays NaN.

        Raises:
          ValueError: a finite value maps beyond float64, naming where.
        """
        values = np.asarray(values, dtype=np.float64)
        loc, scale = self._broadcast(values, series_code)
        with np.errstate(over="ignore"):
            linear = values * scale + loc
            result = inverse_transform_values(linear, self.target_transform)
        overflow = np.isinf(result) & np.isfinite(values)
        if overflow.any():
            index = tuple(int(i) for i in np.argwhere(overflow)[0])
            code = int(np.asarray(series_code)[index[0]])
            place = (
                where(index) if where is not None else f"the value of series code {code} at {index}"
            )
            units = (
                f"{linear[index]:.6g} in log1p units, whose expm1 is"
                if self.target_transform == "log1p"
                else f"which times its scale {self.scale[code]:.4g} plus {self.loc[code]:.4g} is"
            )
            raise ValueError(
                f"{place} is {values[index]:.6g} on the model's scale, {units} "
                f"beyond float64 in the target's units ({int(overflow.sum())} such values): "
                "far outside anything the model was trained on (a broken or diverged model), "
                "refused rather than returned as inf"
            )
        return result


@dataclasses.dataclass(frozen=True, eq=False)
class FeatureScaler:
    """Per-column standardisation `(x - mean) / std` of real-valued inputs, shared by all series.

    Attributes:
      loc: (F,) column means.
      scale: (F,) column standard deviations (1 for constant columns).
      low: (F,) each column's smallest training value; None for a scaler
        made without it (one saved before it was kept): nothing is then
        compared (`far_outside`).
      high: (F,) each column's largest training value; None likewise.
    """

    loc: np.ndarray
    scale: np.ndarray
    low: np.ndarray | None = None
    high: np.ndarray | None = None

    @classmethod
    def fit(cls, values: np.ndarray) -> FeatureScaler:
        """Fits on `values` (R, F), the training rows, ignoring NaN."""
        values = np.asarray(values, dtype=np.float64)
        if values.ndim != 2:
            raise ValueError(f"values must be (R, F), got shape {values.shape}")
        columns = [column[~np.isnan(column)] for column in values.T]
        stats = [_location_scale(column, "standard") for column in columns]
        return cls(
            loc=np.array([s[0] for s in stats], dtype=np.float64),
            scale=np.array([s[1] for s in stats], dtype=np.float64),
            low=np.array([column.min() if column.size else np.nan for column in columns]),
            high=np.array([column.max() if column.size else np.nan for column in columns]),
        )

    @property
    def constant(self) -> np.ndarray | None:
        """(F,) whether each column was constant in training (up to float64 rounding).

        The spread test of the module docstring, on the training range: such
        a column is centred and left unscaled, so the model learnt no effect
        of it. None without a recorded range.
        """
        if self.low is None or self.high is None:
            return None
        return np.array(
            [_negligible(float(hi - lo), float(c)) for lo, hi, c in
             zip(self.low, self.high, self.loc, strict=True)],
            dtype=bool,
        )  # fmt: skip

    def far_outside(self, values: np.ndarray, columns: np.ndarray) -> np.ndarray | None:
        """(R, C) whether each of `values` (R, C) lies far from its column's training values.

        Far: beyond the column's training range `[low, high]` by more than
        the range's width `high - low` (e.g. below -1 or above 2 for a 0/1
        column), or, for a column constant in training (`constant`), any
        other value than its training one (beyond float64 rounding of it).
        NaN is never far. None without a recorded range (`low`, `high`).

        Args:
          values: (R, C) values in the columns' own units.
          columns: (C,) int index of each column of `values` among the scaler's.
        """
        if self.low is None or self.high is None:
            return None
        values = np.asarray(values, dtype=np.float64)
        low, high = self.low[columns], self.high[columns]
        magnitude = np.maximum(np.abs(low), np.abs(high))
        margin = np.maximum(high - low, NEGLIGIBLE_SPREAD * magnitude)
        with np.errstate(invalid="ignore"):
            return (values < low - margin) | (values > high + margin)

    def transform(self, values: np.ndarray) -> np.ndarray:
        """Standardises `values` (R, F); returns float64."""
        return (np.asarray(values, dtype=np.float64) - self.loc) / self.scale
