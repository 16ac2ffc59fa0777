"""Sliding windows over a panel of regular series, gathered lazily into model-ready arrays.

A window is identified by the row `s` of its first forecast step in the
concatenated panel: its history is rows `s-T .. s-1` and its horizon rows
`s .. s+H-1`, all of one series. Arrays are gathered only for the windows
asked for, so an epoch over many long windows never holds them all at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

# Floor of a window's target scale, in units of the per-series scaler.
WINDOW_SCALE_FLOOR = 0.05

MODEL_FIELDS = (
    "static",
    "static_categorical",
    "historical",
    "future",
    "known_history",
    "target",
)


@dataclasses.dataclass(frozen=True, eq=False)
class Panel:
    """All series on their regular grids, concatenated row-wise (R rows), as model inputs.

    Attributes:
      series_code: (R,) int32 series code of each row; rows of a series are
        contiguous and in time order.
      times: (R,) timestamps of the rows.
      observed: (R, U) float32 observed inputs (scaled target first).
      known: (R, K) float32 known inputs.
      target: (R,) float32 scaled target, gaps filled.
      target_mask: (R,) float32, 1 where the target was observed, 0 where filled.
      static: (num_series, S) float32 real-valued statics per series code.
      series_start: (num_series,) int64 first row of each series.
      series_length: (num_series,) int64 number of rows of each series.
      static_categorical: (num_series, C) int32 categorical statics per series
        code (the id's vocabulary code first); None uses the series code itself.
      known_categorical: (R, Kc) int32 categorical known inputs, or None.
      observed_categorical: (R, Uc) int32 categorical observed inputs, or None.
    """

    series_code: np.ndarray
    times: pd.DatetimeIndex
    observed: np.ndarray
    known: np.ndarray
    target: np.ndarray
    target_mask: np.ndarray
    static: np.ndarray
    series_start: np.ndarray
    series_length: np.ndarray
    static_categorical: np.ndarray | None = None
    known_categorical: np.ndarray | None = None
    observed_categorical: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.series_code.shape[0])

    def __repr__(self) -> str:
        """One line: its sizes, not its arrays (a notebook showed every row's index)."""
        return (
            f"Panel({len(self.series_length)} series, {len(self)} rows, "
            f"{self.observed.shape[1]} observed and {self.known.shape[1]} known inputs)"
        )


def _bound(name: str, value: Any, times: pd.DatetimeIndex) -> pd.Timestamp:
    """`value` as a timestamp comparable with `times`, or a ValueError naming `name`.

    A text without a zone is read in the zone of `times`, as pandas compares it.
    """
    try:
        stamp = pd.Timestamp(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name}={value!r} is not a timestamp ({error})") from None
    if stamp is pd.NaT:
        raise ValueError(f"{name}={value!r} is not a timestamp")
    if isinstance(value, str) and stamp.tz is None and times.tz is not None:
        try:
            stamp = stamp.tz_localize(times.tz)
        except ValueError as error:  # a local time skipped or repeated at a DST change
            raise ValueError(
                f"{name}={value!r} is no single time in {times.tz} ({error})"
            ) from None
    if (stamp.tz is None) != (times.tz is None):
        raise ValueError(
            f"{name}={stamp} is {'naive' if stamp.tz is None else 'timezone-aware'} but the "
            f"panel's times are {'naive' if times.tz is None else f'in zone {times.tz}'}; "
            "give it as they are"
        )
    return stamp


def window_starts(
    panel: Panel,
    history: int,
    horizon: int,
    begin: pd.Timestamp,
    end: pd.Timestamp,
    stride: int = 1,
    require_observed_target: bool = True,
) -> np.ndarray:
    """Rows of the first forecast step of every window whose horizon lies in `[begin, end)`.

    A window needs `history` rows of its own series before its start and
    `horizon` rows from it; its history may reach back before `begin`.

    Args:
      panel: the panel.
      history: T.
      horizon: H.
      begin: earliest allowed time of the first forecast step.
      end: the last forecast step must be earlier than this.
      stride: keep every `stride`-th eligible window of each series, from its first.
      require_observed_target: True: leave out the windows with a filled
        (missing) target at any forecast step; False: only those with a filled
        target at every forecast step (nothing to train on or score).
        `windows_in_period` lists them all.

    Returns:
      (N,) int64 start rows, ordered by series code then time.

    Raises:
      TypeError: `history` or `horizon` not an int.
      ValueError: `history` or `horizon` below 1 (a horizon of 0 read the row
        before each start as its last forecast step), `stride` not an int >= 1,
        or `begin`/`end` naive where the panel's times are timezone-aware or
        the reverse.
    """
    candidates = windows_in_period(panel, history, horizon, begin, end)
    if isinstance(stride, bool) or not isinstance(stride, int | np.integer) or stride < 1:
        raise ValueError(f"stride must be an int >= 1, got {stride!r}")
    filled = filled_horizon_steps(panel, candidates, horizon)
    candidates = candidates[filled == 0 if require_observed_target else filled < horizon]
    if stride == 1 or candidates.size == 0:
        return candidates
    # The candidates of a series are contiguous (rows in series order): number each from
    # its series' first and keep every stride-th, in one pass over the candidates.
    series = panel.series_code[candidates]
    position = np.arange(candidates.shape[0])
    first = np.concatenate([[True], series[1:] != series[:-1]])
    since_first = position - np.maximum.accumulate(np.where(first, position, 0))
    return candidates[since_first % stride == 0]


def windows_in_period(
    panel: Panel, history: int, horizon: int, begin: pd.Timestamp, end: pd.Timestamp
) -> np.ndarray:
    """`window_starts` of every window that fits in the period, whatever its targets.

    (N,) int64 start rows, ordered by series code then time; raises as
    `window_starts` does for `history`, `horizon`, `begin` and `end`.
    """
    for name, value in (("history", history), ("horizon", horizon)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    begin, end = _bound("begin", begin, panel.times), _bound("end", end, panel.times)
    rows = np.arange(len(panel), dtype=np.int64)
    code = panel.series_code
    offset = rows - panel.series_start[code]
    fits = (offset >= history) & (offset + horizon <= panel.series_length[code])
    candidates = rows[fits]
    last = candidates + horizon - 1
    times = panel.times
    inside = (times[candidates] >= begin) & (times[last] < end)
    return candidates[np.asarray(inside)]


def _filled_before(panel: Panel) -> np.ndarray:
    """(R+1,) int64: the filled target steps (`target_mask` 0) before each row, and in all.

    Rows `a .. b-1` hold `filled[b] - filled[a]` of them.
    """
    return np.concatenate([[0], np.cumsum(panel.target_mask == 0, dtype=np.int64)])


def filled_history_steps(panel: Panel, starts: np.ndarray, history: int) -> np.ndarray:
    """(N,) int64: how many of each window's `history` target steps were filled.

    The windows start at rows `starts` (their first forecast step); filled
    steps are those with `target_mask` 0 (missing in the table, forward-filled).
    """
    filled = _filled_before(panel)
    return filled[starts] - filled[starts - history]


def filled_horizon_steps(panel: Panel, starts: np.ndarray, horizon: int) -> np.ndarray:
    """(N,) int64: how many of each window's `horizon` forecast target steps were filled.

    The windows start at rows `starts` (their first forecast step); filled
    steps are those with `target_mask` 0 (missing in the table, forward-filled).
    """
    filled = _filled_before(panel)
    return filled[starts + horizon] - filled[starts]


def batch_indices(
    num_items: int,
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int | np.random.Generator = 0,
    drop_last: bool = False,
) -> Iterator[np.ndarray]:
    """Yields index arrays that cover `range(num_items)` once, in batches.

    Args:
      num_items: number of items.
      batch_size: items per batch.
      shuffle: permute with `np.random.default_rng(seed)` first.
      seed: int seed or a Generator; one seed gives one order.
      drop_last: skip the final batch when it is smaller than `batch_size`.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
        raise TypeError(f"batch_size must be an int, got {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if isinstance(num_items, bool) or not isinstance(num_items, int | np.integer):
        raise TypeError(f"num_items must be an int, got {num_items!r}")
    if num_items < 0:
        raise ValueError(f"num_items must be >= 0, got {num_items}")
    order = np.random.default_rng(seed).permutation(num_items) if shuffle else np.arange(num_items)
    stop = num_items - num_items % batch_size if drop_last else num_items
    for first in range(0, stop, batch_size):
        yield order[first : first + batch_size]


def check_normalized_history(history: int, normalized: bool, where: str = "") -> None:
    """Raises `ValueError` for window normalization over a history of one step.

    Each window is scaled by the mean and spread of its own history's target:
    one step has no spread, so every window's history target would read 0 and
    its scale the floor, and the model would forecast from nothing but its
    other inputs, silently. `where` prefixes the names (`DataConfig.`).
    """
    if normalized and history < 2:
        raise ValueError(
            f"{where}history must be >= 2 with {where}window_normalization=True, got "
            f"{history}: each window is scaled by the mean and spread of its history's "
            "target, which one step cannot give (every window's history target would read "
            "0); give a longer history or window_normalization=False"
        )


@dataclasses.dataclass(frozen=True, eq=False)
class WindowSet:
    """The windows of one split (N of them) over a shared panel.

    Attributes:
      panel: the panel the windows index into.
      starts: (N,) int64 row of each window's first forecast step.
      history: T.
      horizon: H.
      normalized: scale each window's target (history and horizon) by the
        mean and standard deviation of its own observed history target
        (`window_stats`), on top of the per-series scaler: the model then
        sees every window at the same level, as pytorch-forecasting's
        `EncoderNormalizer` and RevIN do, so a series that has grown past its
        training range can still be forecast. `denormalize` maps outputs back.
    """

    panel: Panel
    starts: np.ndarray
    history: int
    horizon: int
    normalized: bool = False

    def __post_init__(self) -> None:
        check_normalized_history(self.history, self.normalized)

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    def __repr__(self) -> str:
        """One line: its sizes, not its arrays."""
        scale = ", normalized" if self.normalized else ""
        return (
            f"WindowSet({len(self)} windows over a panel of {len(self.panel)} rows, history "
            f"{self.history}, horizon {self.horizon}{scale})"
        )

    @property
    def series_code(self) -> np.ndarray:
        """(N,) int32 series code of each window."""
        return self.panel.series_code[self.starts]

    @property
    def forecast_start(self) -> pd.DatetimeIndex:
        """(N,) time of each window's first forecast step."""
        return self.panel.times[self.starts]

    def forecast_times(self, window: int) -> pd.DatetimeIndex:
        """(H,) times of the forecast steps of window number `window`."""
        start = self.starts[window]
        return self.panel.times[start : start + self.horizon]

    def digest(self) -> str:
        """A SHA-256 hex digest of which windows these are and of every panel value they read.

        Windows are named by series code and forecast start time (not by panel
        row: another series growing moves the rows), with the rows they read
        (inputs, scaled target and its mask, categorical codes) and their
        series' statics. Equal digests: the same arrays in the same order (up
        to a hash collision), whatever table they were read from; a resumed
        run compares its checkpoints' digest with its own.
        """
        panel = self.panel
        bounds = np.bincount(self.starts - self.history, minlength=len(panel) + 1)
        bounds = bounds - np.bincount(self.starts + self.horizon, minlength=len(panel) + 1)
        read = np.cumsum(bounds[:-1]) > 0
        codes = panel.series_code[self.starts]
        series = np.unique(codes)
        parts = [
            np.array([self.history, self.horizon, int(self.normalized)], np.int64),
            codes,
            panel.times[self.starts].as_unit("ns").asi8,
            panel.series_code[read],
            panel.observed[read],
            panel.known[read],
            panel.target[read],
            panel.target_mask[read],
            panel.static[series],
        ]
        for rows in (panel.known_categorical, panel.observed_categorical):
            if rows is not None:
                parts.append(rows[read])
        if panel.static_categorical is not None:
            parts.append(panel.static_categorical[series])
        digest = hashlib.sha256()
        for part in parts:
            part = np.ascontiguousarray(part)
            digest.update(f"{part.dtype.str}{part.shape}".encode())
            digest.update(part.tobytes())
        return digest.hexdigest()

    def _checked_indices(self, indices: Any) -> np.ndarray:
        """`indices` as a (B,) int64 array of window numbers in `[0, N)`, or an error naming them.

        NumPy would take 1.9 as window 1 and -1 as the last window, and raise
        its own IndexError past the end.
        """
        array = np.asarray(indices)
        if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
            raise TypeError(
                f"take: indices must be a 1-D array of integer window numbers, got "
                f"{array.dtype} of shape {array.shape}"
            )
        if array.size and (array.min() < 0 or array.max() >= len(self)):  # before a cast wraps
            bad = array[(array < 0) | (array >= len(self))]
            raise ValueError(
                f"take: indices must be window numbers in [0, {len(self)}) (this set holds "
                f"{len(self)} windows), got {bad[:5].tolist()}"
            )
        return array.astype(np.int64, copy=False)

    def take(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Gathers windows `indices` (B,) into arrays for the model.

        Returns:
          A dict of NumPy arrays: `static` (B, S) float32, `static_categorical`
          (B, C) int32 (the id's vocabulary code), `historical` (B, T, U) float32,
          `known_history` (B, T, K) float32, `future` (B, H, K) float32,
          `target` (B, H) float32 (scaled), `target_mask` (B, H) float32 (1 =
          observed), `series_code` (B,) int32 and `index` (B,) int64 (the
          window numbers, for `forecast_start`); with categorical known inputs
          also `known_categorical_history` (B, T, Kc) and `future_categorical`
          (B, H, Kc), with categorical observed inputs `observed_categorical`
          (B, T, Uc), all int32.
        """
        indices = self._checked_indices(indices)
        starts = self.starts[indices]
        past = starts[:, None] + np.arange(-self.history, 0)
        ahead = starts[:, None] + np.arange(self.horizon)
        code = self.panel.series_code[starts]
        arrays = {
            "static": self.panel.static[code],
            "static_categorical": (
                code[:, None]
                if self.panel.static_categorical is None
                else self.panel.static_categorical[code]
            ).astype(np.int32),
            "historical": self.panel.observed[past],
            "known_history": self.panel.known[past],
            "future": self.panel.known[ahead],
            "target": self.panel.target[ahead],
            "target_mask": self.panel.target_mask[ahead],
            "series_code": code.astype(np.int32),
            "index": indices,
        }
        if self.normalized:
            loc, scale = self.window_stats(indices)
            historical = arrays["historical"].copy()
            historical[:, :, 0] = (historical[:, :, 0] - loc[:, None]) / scale[:, None]
            arrays["historical"] = historical
            arrays["target"] = ((arrays["target"] - loc[:, None]) / scale[:, None]).astype(
                np.float32
            )
        known, observed = self.panel.known_categorical, self.panel.observed_categorical
        if known is not None and known.shape[1]:
            arrays["known_categorical_history"] = known[past]
            arrays["future_categorical"] = known[ahead]
        if observed is not None and observed.shape[1]:
            arrays["observed_categorical"] = observed[past]
        return arrays

    def window_stats(self, indices: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`(loc, scale)`, each (B,): the mean and floored std of each window's history target.

        Computed on the per-series scaled target over the observed history
        steps (all steps if none is observed); the scale is
        `sqrt(var + WINDOW_SCALE_FLOOR**2)`, so a flat history never divides by ~0.
        """
        indices = np.arange(len(self)) if indices is None else np.asarray(indices, np.int64)
        past = self.starts[indices][:, None] + np.arange(-self.history, 0)
        values = self.panel.target[past].astype(np.float64)
        weights = self.panel.target_mask[past].astype(np.float64)
        weights = np.where(weights.sum(axis=1, keepdims=True) > 0, weights, 1.0)
        count = weights.sum(axis=1)
        loc = (weights * values).sum(axis=1) / count
        var = (weights * (values - loc[:, None]) ** 2).sum(axis=1) / count
        return loc, np.sqrt(var + WINDOW_SCALE_FLOOR**2)

    def denormalize(self, values: np.ndarray, indices: np.ndarray | None = None) -> np.ndarray:
        """Window-scaled values `(B, ...)` on the per-series scale (as is if not normalized).

        `indices` (B,) are the window numbers of the rows of `values`; None
        means all N windows in order (then B must be N).

        Raises:
          ValueError: when B is not the number of windows `indices` names.
        """
        values = np.asarray(values, dtype=np.float64)
        count = len(self) if indices is None else np.asarray(indices).shape[0]
        if values.ndim == 0 or values.shape[0] != count:
            named = "all windows of the set" if indices is None else "indices"
            raise ValueError(
                f"values of shape {values.shape} must have one row per window of {named} "
                f"({count}); pass the window numbers the rows belong to as indices"
            )
        if not self.normalized:
            return values
        loc, scale = self.window_stats(indices)
        trailing = (1,) * (values.ndim - 1)
        return values * scale.reshape(-1, *trailing) + loc.reshape(-1, *trailing)

    def arrays(self) -> dict[str, np.ndarray]:
        """All N windows at once, as `take` returns them."""
        return self.take(np.arange(len(self)))

    def batches(
        self,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int | np.random.Generator = 0,
        drop_last: bool = False,
    ) -> Iterator[dict[str, np.ndarray]]:
        """Yields one epoch of batches, each a dict as `take` returns (see `batch_indices`)."""
        for indices in batch_indices(
            len(self), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last
        ):
            yield self.take(indices)
