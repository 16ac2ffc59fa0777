"""PNG plots of forecasts, attention, variable importance and training curves (matplotlib).

Figures are built with `matplotlib.figure.Figure` and written by the Agg
canvas, so no display, no `pyplot` global state and no backend switch is
involved. Each function writes one PNG at exactly the path given (a path
whose suffix names another image format is refused) and returns that path.
"""

from __future__ import annotations

import math
import numbers
import os
import pathlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np
import pandas as pd
from matplotlib import dates as mdates
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine

from tft_jax.atomic_files import replaced_atomically
from tft_jax.caller_frame import user_stacklevel
from tft_jax.data import PreparedDataset
from tft_jax.data.listing import first_few, repeated
from tft_jax.data.tables import (
    MISSING_TEXTS,
    _inferred_alias,
    _parse_times,
    parse_frequency,
    plain_value,
    series_grid,
    step_after,
)
from tft_jax.evaluation import (
    Predictions,
    fan_window_indices,
    forecast_frame,
    monotone,
    quantile_column,
    subset,
    to_original_units,
)
from tft_jax.experiments import NON_FINITE_STRINGS
from tft_jax.forecaster.config import quantile_name
from tft_jax.forecaster.run_folder import (
    ATTENTION_PLOT,
    LOSS_CURVES_PLOT,
    VARIABLE_IMPORTANCE_PLOT,
    forecast_plot,
)
from tft_jax.paths import expanded

PathLike = str | pathlib.Path

_BAND = "#9ecae1"
_MEDIAN = "#08519c"
_ACTUAL = "#252525"
_ARMS = {True: "#1b9e77", False: "#d95f02"}

# The most series one fan chart draws (a panel each) unless the caller names them:
# a chart of hundreds of panels is tens of thousands of pixels tall and slow to draw.
MAX_FAN_SERIES = 6

MODEL_LABELS = {
    "seasonal_naive": "seasonal naive",
    "fp32": "TFT fp32",
    "qat": "TFT QAT (fake-quant)",
    "int8": "TFT int8",
}


def model_label(name: str, bits: int = 8) -> str:
    """The label figures and tables give model `name` ('fp32', 'qat', 'int8', ...).

    The integer model keeps its name 'int8' (its codes are int8 arrays) whatever
    its bit width; trained at `bits` other than 8 its label says the width
    ('TFT int4 (codes in int8)'), so a 4-bit model is never shown as an 8-bit one.
    """
    if name == "int8" and bits != 8:
        return f"TFT int{bits} (codes in int8)"
    return MODEL_LABELS[name]


def _save(figure: Figure, path: PathLike) -> pathlib.Path:
    """Writes `figure` as a PNG at exactly `path` and returns it.

    Matplotlib picks the format from the suffix and, for a path without one,
    appends '.png': the file announced would not exist. The format is fixed
    to PNG instead, and a suffix naming another image format is refused
    rather than written as a PNG under a misleading name.
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(
            f"path must be a str or os.PathLike naming the PNG to write, "
            f"got {type(path).__name__} {path!r}"
        )
    path = expanded(path)  # as the CLI's flags and pandas do
    suffix = path.suffix.lower().lstrip(".")
    if suffix != "png" and suffix in figure.canvas.get_supported_filetypes():
        raise ValueError(f"plots are written as PNG; path {str(path)!r} names a .{suffix} file")
    # Refused here by name: the write failed with IsADirectoryError naming a temporary
    # file, or mkdir with a bare FileExistsError.
    if path.is_dir():
        raise ValueError(f"path {str(path)!r} is a directory; name the PNG file to write in it")
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise ValueError(f"path {str(path)!r}: its parent {str(parent)!r} is not a folder")
            break
    path.parent.mkdir(parents=True, exist_ok=True)
    # Room between stacked panels for the tick labels of one and the title of the next
    # (every figure here is made with layout="constrained").
    cast(ConstrainedLayoutEngine, figure.get_layout_engine()).set(h_pad=0.12)
    with replaced_atomically(path) as temporary:
        figure.savefig(temporary, dpi=110, format="png")
    return path


def _note(axis: Any, text: str) -> None:
    """Writes `text` in the lower left corner of `axis`: what the data held but was not drawn."""
    axis.annotate(
        text, (0.01, 0.05), xycoords="axes fraction", fontsize=8, color="#444444",
        bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8},
    )  # fmt: skip


def _non_finite_note(count: int, total: int, what: str) -> str:
    """'2 of 9 weights non-finite, not drawn'; 'all 9 ... nothing to draw' when none is finite."""
    if count == total:
        return f"all {total} {what} non-finite: nothing to draw"
    return f"{count} of {total} {what} non-finite, not drawn"


def _is_real_number(value: Any) -> bool:
    """A real number, NaN included, and not a bool (True is no forecast of 1)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


def _is_number_or_missing(value: Any) -> bool:
    """A real number (`_is_real_number`) or a missing value (None, NaN, pd.NA)."""
    return value is None or value is pd.NA or _is_real_number(value)


def _numeric_column(table_name: str, table: pd.DataFrame, column: str) -> pd.Series:
    """`table[column]` as float64, or a TypeError naming the column and its first non-number.

    Cells holding a missing-value text (`MISSING_TEXTS`: 'n/a', '-', ...) are
    missing, as the data layer reads them (which announced them); any other
    text would be drawn on matplotlib's category axis, one tick per distinct
    text, so it is refused.
    """
    values = table[column]
    if isinstance(values, pd.DataFrame):
        raise ValueError(f"{table_name} has {values.shape[1]} columns named {column!r}; need one")
    if pd.api.types.is_bool_dtype(values):
        raise TypeError(f"{table_name} column {column!r} must hold numbers, got booleans")
    if pd.api.types.is_numeric_dtype(values):
        return values.astype(np.float64)
    texts = values.astype("string").str.strip().str.lower()
    missing = values.isna() | texts.isin(MISSING_TEXTS).fillna(False).astype(bool)
    readable = values.where(~missing)
    numbers_read = pd.to_numeric(readable.map(_plain_number), errors="coerce")
    bad = (numbers_read.isna() & ~missing).to_numpy()
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        value = values.iloc[position]
        raise TypeError(
            f"{table_name} column {column!r} must hold numbers, got {value!r} "
            f"({type(value).__name__}) at position {position} ({int(bad.sum())} such cells); "
            "convert the column, e.g. with pd.to_numeric, before plotting"
        )
    return numbers_read.astype(np.float64)


def _plain_number(value: Any) -> Any:
    """`value` for `pd.to_numeric`, with a bool as a non-number (True is no forecast of 1)."""
    return None if isinstance(value, bool | np.bool_) else value


def _with_breaks(line: pd.DataFrame, time_col: str, freq: str | None) -> pd.DataFrame:
    """`line` (`time_col` sorted, `actual`) with a NaN row between times over a step apart.

    A line joins neighbouring points: across times missing from the table
    (forecast windows left out, rows absent) it was drawn straight, as if the
    steps between held values. The step is `freq` (a pandas offset alias, as
    `TableSpec.freq`: a month is one step whatever its length); without it,
    the frequency pandas infers from the times, else the most common
    difference between neighbours, a gap being over 1.5 of it.
    """
    line = line[line[time_col].notna()]
    times = line[time_col]
    if len(line) < 2:
        return line
    if pd.api.types.is_datetime64_any_dtype(times):
        index = pd.DatetimeIndex(times)
        if freq is None:
            freq = _inferred_alias(index)  # without pandas' warning about its result type
        if freq is not None:
            grid = series_grid(index, freq)
            # Grid times strictly between neighbours: the steps the table lacks.
            between = np.searchsorted(grid, index[1:], "left") - np.searchsorted(
                grid, index[:-1], "right"
            )
            # Each checked from its own time: a grid anchored at a day that a clock change
            # shifted (Santiago's 01:00 midnight) is off by an hour on the next days.
            gaps = np.array(
                [
                    g
                    for g in np.flatnonzero(between > 0)
                    if step_after(index[g], freq) < index[g + 1]
                ],
                dtype=np.int64,
            )
        else:
            gaps = _wide_steps(np.diff(index.asi8).astype(np.float64))
    elif pd.api.types.is_numeric_dtype(times) and not pd.api.types.is_bool_dtype(times):
        gaps = _wide_steps(np.diff(times.to_numpy(dtype=np.float64)))
    else:
        return line  # texts: matplotlib's category axis, one tick per value
    if not gaps.size:
        return line
    before, after = times.iloc[gaps].reset_index(drop=True), times.iloc[gaps + 1]
    breaks = pd.DataFrame(
        {time_col: before + (after.reset_index(drop=True) - before) / 2, "actual": np.nan}
    )
    return pd.concat([line, breaks], ignore_index=True).sort_values(time_col, kind="stable")


def _wide_steps(steps: np.ndarray) -> np.ndarray:
    """Positions of `steps` over 1.5 times the most common positive step."""
    positive = steps[steps > 0]
    if not positive.size:
        return np.array([], dtype=np.int64)
    sizes, counts = np.unique(positive, return_counts=True)
    return np.flatnonzero(steps > 1.5 * sizes[np.argmax(counts)])


def _concise_dates(axis: Any) -> None:
    """Date ticks labelled without repeating what the neighbours say, on a time axis.

    Matplotlib's default labels are full dates ('2024-05-31'), which overlapped
    on a panel of a few weeks. The locator keeps the times' zone.
    """
    locator = axis.xaxis.get_major_locator()
    if isinstance(locator, mdates.AutoDateLocator):
        axis.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=locator.tz))


def _time_label(times: pd.Series) -> str:
    """'time (Europe/Berlin)' for aware times, 'time' for naive ones (or not times)."""
    zone = getattr(times.dt, "tz", None) if pd.api.types.is_datetime64_any_dtype(times) else None
    return "time" if zone is None else f"time ({zone})"


def _checked_series_list(series: Any) -> list[Any]:
    """`series` as a list of ids: a ValueError or TypeError for a string, an empty list, repeats."""
    if isinstance(series, (str, bytes)) or not isinstance(series, Sequence | np.ndarray):
        hint = f" (for one series pass [{series!r}])" if isinstance(series, str) else ""
        raise TypeError(f"series must be a list of series ids, got {series!r}{hint}")
    series = list(series)
    if not series:
        raise ValueError("series is empty: name at least one series to draw")
    twice = repeated(series)
    if twice:
        raise ValueError(
            f"series must not repeat an id (one panel each), got {[plain_value(v) for v in twice]}"
        )
    return series


def _unknown_series(unknown: Sequence[Any], known: Sequence[Any], where: str) -> ValueError:
    """The error for `series` naming ids `where` lacks: the ids it has as written, and a
    hint where a text names a numeric id ('104' for 104, as the command line gives them)."""
    known = [plain_value(value) for value in known]
    message = (
        f"series {[plain_value(value) for value in unknown]} are not in {where}; it has "
        f"{first_few([repr(value) for value in known], limit=10)}"
    )
    by_text = {str(value): value for value in known if not isinstance(value, str)}
    hints = [
        f"{by_text[name]!r}, not {name!r}"
        for name in unknown
        if isinstance(name, str) and name in by_text
    ]
    if hints:
        message += f" (its ids are not texts: pass {'; '.join(hints)})"
    return ValueError(message)


def isolated(values: np.ndarray) -> np.ndarray:
    """(N,) bool: the finite values of `values` (N,) whose neighbours are both missing or absent."""
    finite = np.isfinite(values)
    before = np.concatenate([[False], finite[:-1]])
    after = np.concatenate([finite[1:], [False]])
    return finite & ~before & ~after


def _mark_lone_forecast_values(
    axis: Any, window: pd.DataFrame, time_col: str, lower: str, median: str, upper: str
) -> None:
    """Marks the finite forecast values of one window that its band and median leave out.

    A fill spans steps whose two bounds are finite and a line joins finite
    neighbours, so a finite value between gaps (or a bound whose pair is not
    finite) was in the figure's data but invisible, while the panel's note
    counted only the non-finite values as not drawn. Such a band step is drawn
    as a bar (as a one-step window's is), such a median as a dot, and a bound
    without its pair as a tick at its value.
    """
    times = window[time_col]
    low = window[lower].to_numpy(dtype=np.float64)
    high = window[upper].to_numpy(dtype=np.float64)
    centre = window[median].to_numpy(dtype=np.float64)
    if len(window) > 1:
        # A one-step window is drawn as a bar and a dot already.
        spanned = isolated(np.where(np.isfinite(low) & np.isfinite(high), 0.0, np.nan))
        if spanned.any():
            axis.vlines(times[spanned], low[spanned], high[spanned], color=_BAND, lw=6,
                        label="_band between gaps")  # fmt: skip
        alone = isolated(centre)
        if alone.any():
            axis.plot(times[alone], centre[alone], ls="none", marker="o", ms=4, color=_MEDIAN,
                      label="_median between gaps")  # fmt: skip
    unpaired = np.isfinite(low) != np.isfinite(high)
    if unpaired.any():
        bounds = np.where(np.isfinite(low), low, high)
        axis.plot(times[unpaired], bounds[unpaired], ls="none", marker="_", ms=10, mew=2,
                  color=_BAND, label="_band bound without its pair")  # fmt: skip


def plot_forecast_fans(
    path: PathLike,
    forecasts: pd.DataFrame,
    context: pd.DataFrame,
    *,
    id_col: str,
    time_col: str,
    lower: str,
    median: str,
    upper: str,
    title: str = "",
    units: str = "",
    freq: str | None = None,
    legend_loc: str = "upper right",
) -> pathlib.Path:
    """Fan charts, one panel per series: the `lower`-`upper` band, the median, the actuals.

    Args:
      path: the PNG to write.
      forecasts: rows of forecast steps with columns `id_col`, `time_col`,
        `forecast_start` (one band per window), `lower`, `median`, `upper`
        and `actual` (as `evaluation.forecast_frame`).
      context: actuals shown before (and under) the forecasts: columns
        `id_col`, `time_col`, `actual`.
      id_col, time_col: the id and time columns.
      lower, median, upper: the quantile columns of the band and the median.
      title: figure title.
      units: y-axis label.
      freq: the time step, a pandas offset alias (`TableSpec.freq`); default
        the frequency pandas infers from the times, else the most common
        step between them (a business-day line with a gap then breaks at
        every weekend too: give `freq='B'`).
      legend_loc: where the first panel's legend goes (matplotlib's `loc`,
        e.g. 'best'), so that it can be kept off the forecasts.

    The band and median are labelled by their column names. The x axis is
    labelled with the time column's zone ('time (Europe/Berlin)').

    Missing actuals are drawn as gaps (the future has none): a NaN actual,
    and a time more than one step (`freq`) after the one before it, whose
    steps in between the tables lack (the actuals between forecast windows
    are those of `context`). A panel without any finite actual says so in
    its note, and the legend lists 'actual' only where one is drawn. A non-finite
    value of `lower`, `median` or `upper` leaves a gap in the band or the
    median, and a note in the panel counts them per column; a finite value
    that the gaps leave without a neighbour to fill or join is still marked
    (a bar, a dot, or a tick for a bound whose pair is not finite), so that
    only what the note counts is left out. A panel with no
    finite forecast value at all still shows the actuals, and its note says
    so.

    Raises:
      ValueError: naming the columns `forecasts` or `context` lacks, when
        `forecasts` is empty, or for an unknown `freq`.
      TypeError: naming a quantile or `actual` column that holds something
        other than numbers (texts, dates, booleans), and its first such value.
    """
    for name, table, needed in (
        (
            "forecasts",
            forecasts,
            (id_col, time_col, "forecast_start", lower, median, upper, "actual"),
        ),
        ("context", context, (id_col, time_col, "actual")),
    ):
        missing = [column for column in dict.fromkeys(needed) if column not in table.columns]
        if missing:
            raise ValueError(f"{name} lacks the columns {missing}; it has {list(table.columns)}")
    quantile_columns = list(dict.fromkeys((lower, median, upper)))
    forecasts = forecasts.assign(
        **{
            column: _numeric_column("forecasts", forecasts, column)
            for column in (*quantile_columns, "actual")
        }
    )
    context = context.assign(actual=_numeric_column("context", context, "actual"))
    if freq is not None:
        parse_frequency(freq)
    series = list(pd.unique(forecasts[id_col]))
    if not series:
        raise ValueError("forecasts is empty: nothing to plot")
    figure = Figure(figsize=(11, 2.6 * len(series)), layout="constrained")
    axes = figure.subplots(len(series), 1, squeeze=False)[:, 0]
    for axis, name in zip(axes, series, strict=True):
        rows = forecasts[forecasts[id_col] == name].sort_values(time_col)
        past = context[context[id_col] == name].sort_values(time_col)
        actual = pd.concat([past[[time_col, "actual"]], rows[[time_col, "actual"]]])
        actual = actual.drop_duplicates(time_col).sort_values(time_col)
        actual = _with_breaks(actual, time_col, freq)
        seen = bool(np.isfinite(actual["actual"].to_numpy(dtype=np.float64)).any())
        axis.plot(actual[time_col], actual["actual"], color=_ACTUAL, lw=1.0,
                  label="actual" if seen else "_actual")  # fmt: skip
        # A line joins finite neighbours only: an actual between gaps would not be drawn.
        alone = isolated(actual["actual"].to_numpy(dtype=np.float64))
        if alone.any():
            axis.plot(actual[time_col][alone], actual["actual"][alone], ls="none", marker=".",
                      ms=4, color=_ACTUAL, label="_actual between gaps")  # fmt: skip
        # One band per forecast window, so consecutive windows are not joined.
        for start, window in rows.groupby("forecast_start", sort=True):
            first = start == rows["forecast_start"].min()
            band = f"{lower}-{upper}" if first else None
            # A one-step window (horizon 1) has no width to fill nor a line to draw.
            single = len(window) == 1
            if single:
                axis.vlines(
                    window[time_col], window[lower], window[upper], color=_BAND, lw=6, label=band
                )
            else:
                axis.fill_between(
                    window[time_col],
                    window[lower],
                    window[upper],
                    color=_BAND,
                    alpha=0.7,
                    lw=0,
                    label=band,
                )
            axis.plot(
                window[time_col],
                window[median],
                color=_MEDIAN,
                lw=1.3,
                marker="o" if single else None,
                ms=4,
                label=median if first else None,
            )
            _mark_lone_forecast_values(axis, window, time_col, lower, median, upper)
        notes = [] if seen else ["no finite actual value: none drawn"]
        bad = {column: int(np.sum(~np.isfinite(rows[column]))) for column in quantile_columns}
        if any(bad.values()):
            counts = ", ".join(f"{column} {count}" for column, count in bad.items() if count)
            every = all(count == len(rows) for count in bad.values())
            notes.append(
                f"no finite forecast value ({len(rows)} steps): nothing drawn"
                if every
                else f"non-finite forecast values, not drawn: {counts} (of {len(rows)} steps)",
            )
        if notes:
            _note(axis, "\n".join(notes))
        axis.set_title(str(name), fontsize=10, loc="left")
        axis.set_ylabel(units)
        axis.set_xlabel(_time_label(rows[time_col]))
        _concise_dates(axis)
        axis.grid(alpha=0.3)
    # One legend for all panels: an entry drawn in any (the first may lack actuals).
    entries: dict[str, Any] = {}
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    if entries:
        axes[0].legend(entries.values(), entries.keys(), loc=legend_loc, fontsize=8, ncol=3)
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def plot_attention(
    path: PathLike,
    attention: Any,
    history: int,
    *,
    horizons: Sequence[int] | None = None,
    title: str = "Attention over the history (test set mean)",
) -> pathlib.Path:
    """Mean attention of horizon queries over the history positions `-T .. -1`.

    Args:
      path: the PNG to write.
      attention: `(H, T+H)` weights of each horizon query over the window,
        averaged over windows and heads.
      history: `T`.
      horizons: 1-based horizon steps drawn as their own curves; default the
        first, middle and last. The mean over all horizons is drawn bold.
      title: figure title.

    Only the history columns are drawn; the rest of each row's weight falls
    on the forecast (decoder) positions `0..H-1`, so the curves sum to less
    than 1. The legend's title says that share: the decoder columns' sum,
    averaged over the horizon steps with a finite sum.

    A non-finite weight over the history (a diverged model) leaves a gap in
    its curve and in the mean at its lag, and a note counts them; with no
    finite weight at all the figure is still written (the run's other plots
    go on) with a note saying nothing could be drawn.

    Raises:
      ValueError: for a `history` below 1, `attention` not of shape
        `(H, T+H)` with `H >= 1`, or `horizons` outside `1..H` or repeated.
      TypeError: for `attention` that does not hold numbers.
    """
    if isinstance(history, bool) or not isinstance(history, numbers.Integral) or history < 1:
        raise ValueError(f"history must be an int >= 1 (T), got {history!r}")
    try:
        attention = np.asarray(attention, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise TypeError(f"attention must be an (H, T+H) array of numbers: {error}") from None
    # Columns T.. are the horizon steps: another width would put the lags on the wrong columns.
    if (
        attention.ndim != 2
        or attention.shape[0] < 1
        or attention.shape[1] != history + len(attention)
    ):
        raise ValueError(
            f"attention must have shape (H, T+H) with T={history} and H >= 1, got {attention.shape}"
        )
    steps = attention.shape[0]
    if horizons is None:
        horizons = sorted({1, (steps + 1) // 2, steps})
    horizons = list(horizons)
    for step in horizons:
        whole = not isinstance(step, bool) and isinstance(step, numbers.Integral)
        if not whole or not 1 <= step <= steps:
            raise ValueError(f"horizons must lie in 1..{steps} (whole steps), got {step!r}")
    twice = sorted(int(step) for step in repeated(horizons))
    if twice:
        raise ValueError(f"horizons must not repeat a step (one curve each), got {twice} twice")
    lags = np.arange(-history, 0)
    figure = Figure(figsize=(10, 3.8), layout="constrained")
    axis = figure.subplots()
    for step in horizons:
        axis.plot(lags, attention[step - 1, :history], lw=0.9, alpha=0.8, label=f"horizon {step}")
    axis.plot(lags, attention[:, :history].mean(axis=0), color="black", lw=1.8, label="mean")
    drawn = attention[:, :history]
    bad = int(np.sum(~np.isfinite(drawn)))
    if bad:
        _note(axis, _non_finite_note(bad, drawn.size, "weights over the history"))
    axis.set_xlabel("history position (steps before the forecast start)")
    axis.set_ylabel("attention weight")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, title=_decoder_share_text(attention[:, history:]), title_fontsize=8)
    return _save(figure, path)


def _decoder_share_text(decoder: np.ndarray) -> str:
    """What the attention plot leaves out: the mean weight on the decoder positions `0..H-1`."""
    sums = decoder.sum(axis=1)
    finite = np.isfinite(sums)
    last = decoder.shape[1] - 1
    if not finite.any():
        return f"weight on forecast steps 0..{last}: non-finite (not drawn)"
    return f"{float(sums[finite].mean()):.1%} of the weight on forecast steps 0..{last} (not drawn)"


def plot_variable_importance(
    path: PathLike,
    groups: Sequence[tuple[str, Sequence[str], Any]],
    *,
    title: str = "Variable selection weights (test set mean)",
) -> pathlib.Path:
    """Horizontal bars of mean selection weights, one panel per group.

    Args:
      path: the PNG to write.
      groups: `(panel title, variable names, weights)` triples, e.g. static,
        history and future inputs; `weights` holds one entry per name (a
        column `(V, 1)` is read as `(V,)`): averaged selection weights, a
        top-k of them, or other non-negative importances. Empty groups are
        left out.
      title: figure title.

    A non-finite weight (a diverged model) is drawn as an empty bar whose
    label shows its value; the scale comes from the finite weights.

    Raises:
      TypeError: for names given as one string (which would be read as one
        name per character), or weights that are not numbers.
      ValueError: for weights with more than one axis longer than 1 (a raw
        `(B, T, V)` array was flattened into one bar per entry), names and
        weights of different lengths, a negative weight (selection weights are
        softmax outputs, in 0..1), naming the group (and the variable), or
        when every group is empty.
    """
    kept = []
    for name, labels, weights in groups:
        if isinstance(labels, (str, bytes)):
            raise TypeError(
                f"group {name!r}: names must be a sequence of variable names, got the string "
                f"{labels!r} (pass [{labels!r}] for one variable)"
            )
        labels = list(labels)
        try:
            weights = np.asarray(weights, dtype=np.float64)
        except (TypeError, ValueError) as error:
            raise TypeError(f"group {name!r}: weights must be numbers: {error}") from None
        given = weights.shape
        if weights.ndim != 1 and sum(size > 1 for size in weights.shape) <= 1:
            weights = weights.reshape(-1)  # a column or row of one variable per entry
        if weights.ndim != 1:
            raise ValueError(
                f"group {name!r}: weights must be one per variable (averaged over windows and "
                f"steps; at most one axis longer than 1), got shape {weights.shape}"
            )
        if len(labels) != weights.size:
            reshaped = given not in (weights.shape, ())
            read = f", one per entry of the {given} array" if reshaped else ""
            raise ValueError(
                f"group {name!r}: {len(labels)} names for {weights.size} weights{read}; "
                "they must match"
            )
        negative = [f"{labels[i]!r} ({weights[i]:g})" for i in np.flatnonzero(weights < 0)]
        if negative:
            raise ValueError(
                f"group {name!r}: selection weights must be >= 0 (softmax outputs), got "
                f"{', '.join(negative)}"
            )
        if weights.size:
            kept.append((name, labels, weights))
    if not kept:
        raise ValueError("every group is empty: nothing to plot")
    heights = [max(1.2, 0.32 * len(labels) + 0.8) for _, labels, _ in kept]
    figure = Figure(figsize=(7, sum(heights)), layout="constrained")
    axes = figure.subplots(len(kept), 1, squeeze=False, height_ratios=heights)[:, 0]
    for axis, (name, labels, weights) in zip(axes, kept, strict=True):
        # A NaN (a diverged model) would set the scale to NaN and hide every bar, an inf
        # would stop the drawing: the scale comes from the finite weights, and each
        # non-finite one is drawn as an empty bar whose label says what it holds.
        finite = np.isfinite(weights)
        order = np.argsort(np.where(finite, weights, -np.inf), kind="stable")
        shown = [labels[i] if finite[i] else f"{labels[i]} ({weights[i]:g})" for i in order]
        axis.barh(np.arange(weights.size), np.where(finite, weights, 0.0)[order], color=_MEDIAN)
        axis.set_yticks(np.arange(weights.size), shown, fontsize=8)
        axis.set_title(name, fontsize=10, loc="left")
        top = float(weights[finite].max()) if finite.any() else 0.0
        axis.set_xlim(0, max(1e-9, top) * 1.1)
        axis.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("mean selection weight")
    figure.suptitle(title)
    return _save(figure, path)


def _finite(
    values: Sequence[Any], name: str = "values", *, non_finite_strings: bool = False
) -> np.ndarray:
    """`values` as float64, None (not evaluated) as NaN; a TypeError naming `name` otherwise.

    `non_finite_strings`: the strings "nan", "inf" and "-inf" are read as those
    floats (`tft_jax.experiments.NON_FINITE_STRINGS`: how `clipping.json`
    writes a diverged run's values); any other string is still refused.
    """
    texts = NON_FINITE_STRINGS if non_finite_strings else {}
    for position, value in enumerate(values):
        if not (_is_number_or_missing(value) or (isinstance(value, str) and value in texts)):
            allowed = f"None or one of {list(texts)}" if texts else "None"
            raise TypeError(
                f"{name} must hold numbers or {allowed}, got {value!r} "
                f"({type(value).__name__}) at position {position}"
            )
    return np.array(
        [texts[v] if isinstance(v, str) else math.nan if v is None or v is pd.NA else float(v)
         for v in values],
        dtype=np.float64,
    )  # fmt: skip


def _non_finite(values: Sequence[Any]) -> int:
    """How many of `values` are given (not None) yet not finite: NaN or inf."""
    return sum(1 for v in values if v is not None and v is not pd.NA and not math.isfinite(v))


_CURVES = ("step", "train_loss", "val_loss")


def plot_loss_curves(
    path: PathLike,
    phases: Mapping[str, Mapping[str, Sequence[Any]]],
    *,
    title: str = "Training and validation loss",
) -> pathlib.Path:
    """Training and validation loss against the step, phase after phase.

    Args:
      path: the PNG to write.
      phases: phase name (e.g. 'fp32', 'qat') to a training history with
        lists `step`, `train_loss`, `val_loss` (None where absent), as
        `tft_jax.train.fit` returns. Each phase's steps continue where the
        previous phase ended.
      title: figure title.

    A loss that is NaN or inf (a diverged phase), unlike a None, is not
    drawn and is counted in its curve's legend label, e.g. 'fp32 train
    (3 of 10 non-finite)'. A run folder's `history.json` stores them as
    null (JSON has no NaN), so a saved run's curves show gaps, not counts.

    Raises:
      ValueError: naming a phase whose `step`, `train_loss` and `val_loss`
        are missing or of different lengths.
      TypeError: naming a phase's list that holds something other than
        numbers and None.
    """
    if not phases:
        raise ValueError("phases is empty: nothing to plot")
    for name, history in phases.items():
        lengths = {key: len(history[key]) if key in history else None for key in _CURVES}
        if None in lengths.values() or len(set(lengths.values())) != 1:
            raise ValueError(
                f"phase {name!r} must have lists {list(_CURVES)} of one length, got lengths "
                f"{lengths} (None: missing)"
            )
    figure = Figure(figsize=(9, 4), layout="constrained")
    axis = figure.subplots()
    offset = 0.0
    colors = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")

    def label(text: str, values: Sequence[Any]) -> str:
        bad = _non_finite(values)
        return f"{text} ({bad} of {len(values)} non-finite)" if bad else text

    finite = False

    for index, (name, history) in enumerate(phases.items()):
        steps = _finite(history["step"], f"phase {name!r} step") + offset
        train = _finite(history["train_loss"], f"phase {name!r} train_loss")
        validation = _finite(history["val_loss"], f"phase {name!r} val_loss")
        color = colors[index % len(colors)]
        # One evaluation (a budget spent by the first step) is a point: no line to draw.
        axis.plot(
            steps,
            train,
            color=color,
            lw=1.2,
            marker="o" if steps.size == 1 else None,
            label=label(f"{name} train", history["train_loss"]),
        )
        axis.plot(
            steps,
            validation,
            color=color,
            lw=1.2,
            ls="--",
            marker=".",
            label=label(f"{name} validation", history["val_loss"]),
        )
        if steps.size:
            offset = float(steps[-1])
            axis.axvline(offset, color="grey", lw=0.6, alpha=0.5)
        finite |= bool(np.isfinite(train).any() or np.isfinite(validation).any())
    if not finite:
        _note(axis, "no finite loss value: nothing to draw")
    axis.set_xlabel("step")
    axis.set_ylabel("mean quantile loss (scaled target)")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return _save(figure, path)


def _smooth(values: np.ndarray, width: int) -> np.ndarray:
    """Trailing mean over the last `width` values at each step, ignoring NaN and inf."""
    finite = np.isfinite(values)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, values, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    upper = np.arange(1, values.size + 1)
    lower = np.maximum(upper - width, 0)
    count = counts[upper] - counts[lower]
    return np.where(count > 0, (sums[upper] - sums[lower]) / np.maximum(count, 1), np.nan)


def _log_scale_if_positive(axis: Any, values: Sequence[np.ndarray]) -> None:
    """A log y-axis when some drawn value is finite and positive; else linear.

    Matplotlib fails while saving a log axis with no positive finite value
    ("Data cannot be log-scaled"), e.g. when every run diverged.
    """
    if any(np.any(np.isfinite(v) & (v > 0)) for v in values):
        axis.set_yscale("log")


_RUN_KEYS = ("clip", "step_loss", "step_grad_norm", "final_val_loss", "diverged")


def plot_clipping_experiment(
    path: PathLike, result: Mapping[str, Any], *, title: str | None = None
) -> pathlib.Path:
    """Per-step training loss and gradient norm of every run by arm, and final validation losses.

    Args:
      path: the PNG to write.
      result: the dict of `tft_jax.experiments.clipping_experiment`: `runs`,
        each with `clip` (bool), `step_loss` and `step_grad_norm` (per step),
        `final_val_loss` and `diverged`; and `settings` with `learning_rate`
        and `clip_norm`. Or that dict read back from `clipping.json`: a loss
        or norm may be None or one of the strings "nan", "inf" and "-inf"
        (the CLI's strict JSON for non-finite values).
      title: figure title (default from the settings).

    The loss, gradient norm and final loss axes are logarithmic, or linear
    when they hold no positive finite value (every run diverged). Non-finite
    final losses are counted per arm in a note.

    Raises:
      ValueError: for a `result` without `runs`, with no runs, or with a run
        that lacks one of the keys above (naming the run and the keys).
    """
    what = "the dict of tft_jax.experiments.clipping_experiment"
    if not isinstance(result, Mapping) or "runs" not in result:
        given = f"keys {list(result)}" if isinstance(result, Mapping) else type(result).__name__
        raise ValueError(f"result must be {what}, with 'runs' and 'settings'; got {given}")
    runs = result["runs"]
    if not runs:
        raise ValueError("result has no runs: nothing to plot")
    for index, run in enumerate(runs):
        if not isinstance(run, Mapping):
            raise ValueError(f"run {index} of result['runs'] must be a dict, got {run!r}")
        missing = [key for key in _RUN_KEYS if key not in run]
        if missing:
            raise ValueError(
                f"run {index} of result['runs'] lacks the keys {missing}; each run of {what} "
                f"has {list(_RUN_KEYS)}, got {list(run)}"
            )
    settings = result.get("settings", {})
    final_losses = _finite(
        [run["final_val_loss"] for run in runs], "final_val_loss of the runs",
        non_finite_strings=True,
    )  # fmt: skip
    figure = Figure(figsize=(15, 4.2), layout="constrained")
    losses, norms, finals = figure.subplots(1, 3, width_ratios=(1.6, 1.6, 1))
    labelled: set[bool] = set()
    drawn: dict[Any, list[np.ndarray]] = {losses: [], norms: []}
    for index, run in enumerate(runs):
        clip = bool(run["clip"])
        label = None if clip in labelled else ("with clipping" if clip else "without clipping")
        labelled.add(clip)
        style = dict(color=_ARMS[clip], lw=0.9, alpha=0.75, ls=":" if run["diverged"] else "-")
        step_loss = _finite(run["step_loss"], f"run {index} step_loss", non_finite_strings=True)
        grad_norm = _finite(
            run["step_grad_norm"], f"run {index} step_grad_norm", non_finite_strings=True
        )
        steps = np.arange(1, step_loss.size + 1)
        losses.plot(steps, _smooth(step_loss, 5), label=label, **style)
        norms.plot(steps, _smooth(grad_norm, 5), **style)
        drawn[losses].append(step_loss)
        drawn[norms].append(grad_norm)
    if settings.get("clip_norm") is not None:
        norms.axhline(settings["clip_norm"], color="black", lw=0.8, ls="--", label="clip_norm")
        norms.legend(fontsize=8)
    for axis, name in ((losses, "training quantile loss"), (norms, "gradient norm (unclipped)")):
        _log_scale_if_positive(axis, drawn[axis])
        axis.set_xlabel("step")
        axis.set_ylabel(name)
        axis.set_title(f"{name}, 5-step mean (dotted: diverged)", fontsize=10)
        axis.grid(alpha=0.3, which="both")
    losses.legend(fontsize=8)
    for position, clip in enumerate((False, True)):
        values = final_losses[[bool(run["clip"]) == clip for run in runs]]
        jitter = np.linspace(-0.12, 0.12, max(values.size, 1))[: values.size]
        finals.scatter(position + jitter, values, color=_ARMS[clip], zorder=3)
        failed = int(np.sum(~np.isfinite(values)))
        if failed:
            finals.annotate(
                f"{failed} non-finite", (position, 0.02), xycoords=("data", "axes fraction")
            )
    finals.set_xticks([0, 1], ["without clipping", "with clipping"])
    finals.set_xlim(-0.6, 1.6)
    finals.set_ylabel("final validation loss")
    _log_scale_if_positive(finals, [final_losses])
    finals.grid(alpha=0.3, which="both")
    finals.set_title("final validation loss per seed", fontsize=10)
    figure.suptitle(
        title
        or (
            f"QAT at learning rate {settings.get('learning_rate')}: "
            f"clip_by_global_norm({settings.get('clip_norm')}) vs none"
        )
    )
    return _save(figure, path)


def draw_run_plots(
    dataset: PreparedDataset,
    split: str,
    predictions: dict[str, Predictions],
    quantiles: Sequence[float],
    history: dict[str, Any] | None,
    directory: pathlib.Path,
    interpret: str = "fp32",
    postprocess: Callable[[np.ndarray], np.ndarray] | None = None,
    *,
    series: Sequence[Any] | None = None,
    announce: Callable[[str], None] | None = None,
    bits: int = 8,
) -> list[pathlib.Path]:
    """Fan charts per model, attention, variable importance and loss curves as PNGs.

    The attention and variable importance are those of the model `interpret`,
    or of the first of `predictions` when it has no `interpret`.

    The fan charts draw up to 7 back-to-back windows of each series in
    `series` (a list of ids of `dataset.series_ids`, in that order), by
    default of the first `MAX_FAN_SERIES` series with windows in `split`.
    The actuals are the table's over the whole span drawn, so steps between
    windows left out (a missing target in their horizon) show what was
    observed, and missing steps are gaps. Where more series have windows than
    are drawn, the titles say so and `announce` (e.g. `print`) is given a
    line such as 'test fan charts: the first 6 of 30 series'; a named series
    without windows in `split` is not drawn, which `announce` is told (a
    `UserWarning` without `announce`). `bits`: the width of the 'int8' model's
    codes (its QAT `bits`), which its titles name (`model_label`).

    The fans show the forecasts as the library returns and scores them:
    `postprocess` (e.g. `Forecaster.postprocess`, which also clips at 0 with
    `nonnegative`) maps the `(N, H, Q)` quantiles in the target's units; by
    default they are sorted across levels, so the band never shows a crossed
    lowest and highest quantile that `predict`, `forecast` and the metrics
    would have sorted.

    Raises:
      ValueError: for empty `predictions`, or `series` empty, repeated or
        naming an id the dataset lacks.
      TypeError: for `series` given as a string or not as a sequence.
    """
    if not predictions:
        raise ValueError("predictions is empty: nothing to plot")
    returned = monotone if postprocess is None else postprocess
    windows = dataset.split(split)
    spec = dataset.spec
    low, high = quantile_column(min(quantiles)), quantile_column(max(quantiles))
    codes, cut = _fan_series_codes(dataset, windows, split, series, announce)
    chosen = fan_window_indices(windows, per_series=7, codes=codes)
    fan_windows = subset(windows, chosen)
    written = []
    context_steps = min(dataset.history, 2 * dataset.horizon)
    frame = dataset.frame
    # The table's actuals over the whole span drawn, between windows too: the line
    # joined the windows' own actuals across those left out (a missing target in
    # their horizon), hiding the observations between and the missing steps.
    context_rows = np.concatenate(
        [np.array([], dtype=np.int64)]
        + [np.arange(first - context_steps, last + dataset.horizon)
           for first, last in _spans(fan_windows)]
    )  # fmt: skip
    context = frame.iloc[context_rows][[spec.id_col, spec.time_col, spec.target]].rename(
        columns={spec.target: "actual"}
    )
    band = f"{low}-{high} band, median" + (f"; {cut}" if cut else "")
    for name, prediction in ({} if not len(chosen) else predictions).items():
        table = forecast_frame(
            dataset,
            fan_windows,
            returned(to_original_units(dataset, fan_windows, prediction.quantiles[chosen])),
            quantiles,
        )
        written.append(
            plot_forecast_fans(
                directory / forecast_plot(name),
                table,
                context,
                id_col=spec.id_col,
                time_col=spec.time_col,
                lower=low,
                median="p50",
                upper=high,
                title=f"{model_label(name, bits)}: {split} forecasts ({band})",
                units=spec.target,
                freq=spec.freq,
            )
        )
    # Without `interpret` among the predictions the first model is drawn: titled as itself.
    interpret = interpret if interpret in predictions else next(iter(predictions))
    shown = predictions[interpret]
    written.append(
        plot_attention(
            directory / ATTENTION_PLOT,
            shown.attention,
            dataset.history,
            title=f"{model_label(interpret, bits)}: attention over the history ({split} mean)",
        )
    )
    history_names = dataset.history_weight_names_for(len(shown.history_weights))
    written.append(
        plot_variable_importance(
            directory / VARIABLE_IMPORTANCE_PLOT,
            [
                ("static inputs", dataset.static_weight_names, shown.static_weights),
                ("history inputs", history_names, shown.history_weights),
                ("future inputs", dataset.future_weight_names, shown.future_weights),
            ],
            title=f"{model_label(interpret, bits)}: variable selection weights ({split} mean)",
        )
    )
    if history:
        written.append(plot_loss_curves(directory / LOSS_CURVES_PLOT, history))
    return written


def _first_fan_series(present: list[Any]) -> tuple[list[Any], str]:
    """The first `MAX_FAN_SERIES` of `present`, and the cut ('the first 6 of 30 series', or '')."""
    if len(present) <= MAX_FAN_SERIES:
        return present, ""
    return present[:MAX_FAN_SERIES], f"the first {MAX_FAN_SERIES} of {len(present)} series"


def _fan_series_codes(
    dataset: PreparedDataset,
    windows: Any,
    split: str,
    series: Sequence[Any] | None,
    announce: Callable[[str], None] | None,
) -> tuple[list[int], str]:
    """The series codes `draw_run_plots` draws fans of, in order, and the cut ('' if none).

    The named `series` with windows in `split`, else the first `MAX_FAN_SERIES`
    series with windows; 'first 6 of 30 series' where more have windows.
    """
    present = [int(code) for code in np.unique(windows.series_code)]
    if series is None:
        first, cut = _first_fan_series(present)
        if cut and announce is not None:
            announce(f"{split} fan charts: {cut}")
        return first, cut
    series = _checked_series_list(series)
    ids = [plain_value(value) for value in dataset.series_ids]
    unknown = [name for name in series if plain_value(name) not in ids]
    if unknown:
        raise _unknown_series(unknown, ids, "the dataset")
    codes = [ids.index(plain_value(name)) for name in series]
    without = [plain_value(name) for name, code in zip(series, codes, strict=True)
               if code not in present]  # fmt: skip
    if without:
        text = f"{split} fan charts: series {without} have no {split} windows, not drawn"
        if announce is None:
            warnings.warn(text, UserWarning, stacklevel=user_stacklevel())
        else:
            announce(text)
    return [code for code in codes if code in present], ""


def _spans(windows: Any) -> list[tuple[int, int]]:
    """First and last forecast-start row of each series among `windows` (in their order)."""
    codes = windows.series_code
    return [
        (int(windows.starts[codes == code].min()), int(windows.starts[codes == code].max()))
        for code in pd.unique(codes)
    ]


def _checked_future_arguments(
    forecast: pd.DataFrame,
    history: pd.DataFrame,
    id_col: str,
    time_col: str,
    target: str,
    quantiles: Sequence[float],
    series: Sequence[Any] | None,
) -> list[Any] | None:
    """`plot_future`'s `series` as a list (None stays None), after checking its arguments.

    Raises the `ValueError`s and `TypeError`s `plot_future` lists for
    `quantiles`, the column names and `series`.
    """
    if isinstance(quantiles, (str, bytes)) or not isinstance(quantiles, Sequence | np.ndarray):
        raise TypeError(f"quantiles must be a sequence of levels in (0, 1), got {quantiles!r}")
    if not len(quantiles):
        raise ValueError("quantiles is empty: the band needs its lowest and highest level")
    for level in quantiles:
        if not _is_real_number(level):
            raise TypeError(f"quantiles must be numbers in (0, 1), got {level!r}")
        if not 0 < level < 1:
            raise ValueError(f"quantiles must lie in (0, 1), got {level!r} in {tuple(quantiles)}")
    for argument, column, tables in (
        ("id_col", id_col, (("forecast", forecast), ("history", history))),
        ("time_col", time_col, (("forecast", forecast), ("history", history))),
        ("target", target, (("history", history),)),
    ):
        for table_name, table in tables:
            if column not in table.columns:
                raise ValueError(
                    f"{argument}={column!r} is not a column of the {table_name}; its columns "
                    f"are {list(table.columns)}"
                )
    return None if series is None else _checked_series_list(series)


def plot_future(
    path: PathLike,
    forecast: pd.DataFrame,
    history: pd.DataFrame,
    *,
    id_col: str,
    time_col: str,
    target: str,
    quantiles: Sequence[float],
    tail: int,
    series: Sequence[Any] | None = None,
    title: str = "",
    time_format: str | None = None,
    dayfirst: bool = False,
    timezone: str | None = None,
    freq: str | None = None,
) -> pathlib.Path:
    """Fan chart of the forecast after the end of the data, one panel per series.

    Args:
      path: the PNG to write.
      forecast: `Forecaster.predict` output (id, time, `q<level>` columns),
        or that table read back from its CSV (ISO texts, UTC offsets that may
        change with daylight saving time; `timezone` converts them).
      history: the history table (id, time, target); its last `tail` steps
        per series are drawn before the forecast.
      id_col, time_col, target: the column names.
      quantiles: the levels; the band spans the lowest to the highest.
      tail: history steps shown per series.
      series: a list of the series ids to draw, in that order (default: the
        first `MAX_FAN_SERIES` of the forecast, in its order, the title then
        saying so where the forecast has more: 'the first 6 of 42 series').
        A bare string is refused rather than read as one id per character:
        pass `['s1']`.
      title: figure title.
      time_format, dayfirst, timezone: how the model read `history`'s time
        column (`TableSpec`); its texts are parsed as the data layer parsed
        them (day-first dates, mixed UTC offsets) and drawn in the
        forecast's zone, so the history ends where the forecast starts.
      freq: the time step (`TableSpec.freq`), where the actual line breaks
        across steps the history lacks; default inferred (`plot_forecast_fans`).

    The band and median are labelled as in the run's fan charts ('p10-p90',
    'p50'); the legend goes where it covers the least of what is drawn, not
    at the upper right, where the forecast ends every panel. A series without
    history rows (or with only missing targets) is drawn without actuals, and
    its panel says so.

    Raises:
      ValueError: for a negative `tail`; empty `quantiles` or a level outside
        (0, 1); `id_col`, `time_col` or `target` naming a column the forecast
        or the history lacks; `series` empty, repeated or missing from the
        forecast (naming its ids, with a hint where a text such as '104'
        names the numeric id 104); an unknown `freq`; or quantile columns
        `q<level>` of `quantiles` the forecast lacks.
      TypeError: for `quantiles` or `series` given as a string or not as a
        sequence, a level that is not a number, or quantile or target columns
        that do not hold numbers (see `plot_forecast_fans`).
    """
    if isinstance(tail, bool) or not isinstance(tail, numbers.Integral) or tail < 0:
        # pandas' `tail(-n)` keeps all rows but the first n: the whole history, nearly.
        raise ValueError(f"tail must be an int >= 0 (history steps shown), got {tail!r}")
    series = _checked_future_arguments(
        forecast, history, id_col, time_col, target, quantiles, series
    )
    if freq is not None:
        parse_frequency(freq)
    low, high = quantile_name(min(quantiles)), quantile_name(max(quantiles))
    missing = [name for name in (low, quantile_name(0.5), high) if name not in forecast.columns]
    if missing:
        raise ValueError(
            f"the forecast has no columns {missing} for quantiles {tuple(quantiles)} (with "
            f"the median 0.5); its columns are {list(forecast.columns)}"
        )
    if series is not None:
        unknown = [name for name in series if name not in set(forecast[id_col])]
        if unknown:
            raise _unknown_series(unknown, list(pd.unique(forecast[id_col])), "the forecast")
    else:
        series, cut = _first_fan_series(list(pd.unique(forecast[id_col])))
        # Said in the title, as the run's fan charts say it: a caller passing no `series`
        # learns of the ones left out (the command line prints its own line with its hint).
        if cut:
            title = f"{title} ({cut})" if title else cut
    # The panels follow the first appearance of each id: put the rows in `series` order.
    order = {name: index for index, name in enumerate(series)}
    forecast = forecast[forecast[id_col].isin(list(order))]
    forecast = forecast.iloc[np.argsort(forecast[id_col].map(order).to_numpy(), kind="stable")]
    # Labelled as the test fan charts are ('p10-p90', 'p50'): one style in both charts.
    pairs = ((low, min(quantiles)), (quantile_name(0.5), 0.5), (high, max(quantiles)))
    levels = {name: quantile_column(level) for name, level in pairs}
    if {id_col, time_col} & set(levels.values()):
        levels = {name: name for name in levels}
    rows = pd.DataFrame(
        {id_col: forecast[id_col], time_col: forecast[time_col],
         **{label: forecast[name] for name, label in levels.items()}}
    )  # fmt: skip
    # A forecast read back from a CSV has texts, across a daylight saving change with two
    # UTC offsets (which `pd.to_datetime` refuses): read as the data layer reads such texts.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        rows[time_col] = _parse_times(rows[time_col], time_col, rows[id_col], None, False, timezone)
    rows["forecast_start"] = rows.groupby(id_col)[time_col].transform("min")
    rows["actual"] = np.nan
    context = history[[id_col, time_col]].assign(actual=_numeric_column("history", history, target))
    context = context[context[id_col].isin(set(rows[id_col]))].copy()
    with warnings.catch_warnings():  # the data layer warned of mixed offsets when it read them
        warnings.simplefilter("ignore", UserWarning)
        times = _parse_times(
            context[time_col], time_col, context[id_col], time_format, dayfirst, timezone
        )
    zone = rows[time_col].dt.tz
    if not len(times):
        # No history for the series drawn: nothing to convert (parsed from no text, the
        # empty column is naive, and converting it to the forecast's zone failed).
        times = pd.Series([], dtype=rows[time_col].dtype, index=context.index)
    elif (times.dt.tz is None) != (zone is None):
        raise ValueError(
            f"history's {time_col!r} times are {'naive' if times.dt.tz is None else 'tz-aware'} "
            f"but the forecast's are {'naive' if zone is None else f'in zone {zone}'}; "
            "pass the history the forecast was made from"
        )
    context[time_col] = times if zone is None or not len(times) else times.dt.tz_convert(zone)
    context = context.sort_values(time_col).groupby(id_col).tail(tail)
    return plot_forecast_fans(
        path, rows, context, id_col=id_col, time_col=time_col, lower=levels[low],
        median=levels[quantile_name(0.5)], upper=levels[high], title=title, units=target,
        freq=freq, legend_loc="best",
    )  # fmt: skip
