"""AdamW after clipping by global norm, computed on one flat vector of all parameters.

`flat_adamw` has the math of `optax.chain(optax.clip_by_global_norm(c),
optax.adamw(lr, weight_decay=wd, mask=mask))` but concatenates the gradient
leaves into one float32 vector `(N,)` first (`N` = the number of scalars in
the tree), keeps Adam's moments as two such vectors, and splits the update
back into the tree at the end. Why: XLA:CPU does not merge the elementwise
kernels of sibling leaves, so optax's per-leaf transformations compile into
a handful of kernels per parameter leaf (and one reduction per leaf for the
norm), and compile time grows with the number of kernels. On one vector the
whole update is a few kernels, whatever the number of leaves.

The transformation is a plain `optax.GradientTransformationExtraArgs` (a pair
of pure functions), usable anywhere optax expects one (under
`optax.inject_hyperparams` too, whose hyperparameters are traced under
`jax.jit`). Its `update` compares
equal whenever the hyperparameters do, so train states built by two
`flat_adamw` calls with the same settings can share one compiled train step; a
`tft_jax.schedules.WarmupCosine` learning rate is kept in the state, so its
numbers are not among those settings (only `init`, which puts them in the
state, depends on them).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tft_jax.schedules import WarmupCosine
from tft_jax.static_arguments import from_static_argument, static_argument

PyTree = Any
Array = jax.Array

__all__ = [
    "FlatAdamWState",
    "flat_adamw",
    "flat_updates",
    "flatten",
    "global_norm",
    "is_flat_adamw",
    "scheduled_learning_rate",
    "unflatten",
]

# Leaf dtypes the flat float32 vector represents exactly.
_SUPPORTED_DTYPES = tuple(np.dtype(d) for d in (jnp.float32, jnp.bfloat16, jnp.float16))


class FlatAdamWState(NamedTuple):
    """The state of `flat_adamw`.

    Attributes:
      count: int32 scalar, the number of updates so far (saturating at the
        int32 maximum, as optax's counts do).
      mu: `(N,)` float32, Adam's first moment of every scalar parameter, in
        the order of `flatten`.
      nu: `(N,)` float32, Adam's second moment, in the same order.
      schedule: the learning-rate schedule as data, a `WarmupCosine` of four
        float32 scalars, when `flat_adamw` was given one; None when the
        learning rate is a float or another callable (compiled into the step).

    The moments are matched to the parameters by position in `flatten`'s
    order: a state must be updated with gradients of the tree `init` was
    given (`update` checks their size only; a renamed layer reorders the
    leaves).
    """

    count: Array  # type: ignore[assignment]  # the field replaces tuple.count, as in optax
    mu: Array
    nu: Array
    schedule: WarmupCosine | None = None


class _Layout(NamedTuple):
    """How a pytree maps onto the flat vector: structure, and per leaf shape, dtype, size."""

    treedef: Any
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[Any, ...]
    sizes: tuple[int, ...]

    @property
    def size(self) -> int:
        return sum(self.sizes)


def _layout(tree: PyTree, name: str) -> _Layout:
    """The `_Layout` of `tree`; `TypeError` for a leaf that is not float32/bfloat16/float16."""
    leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
    shapes, dtypes = [], []
    for path, leaf in leaves_with_paths:
        dtype = np.dtype(jnp.result_type(leaf))
        if dtype not in _SUPPORTED_DTYPES:
            raise TypeError(
                f"flat_adamw: {name}{jax.tree_util.keystr(path)} has dtype {dtype}; the flat "
                "optimizer works in float32 and takes float32, bfloat16 or float16 leaves only"
            )
        shapes.append(tuple(np.shape(leaf)))
        dtypes.append(dtype)
    sizes = tuple(math.prod(shape) for shape in shapes)
    return _Layout(treedef, tuple(shapes), tuple(dtypes), sizes)


def flatten(tree: PyTree) -> Array:
    """All leaves of `tree`, raveled in `jax.tree.leaves` order and concatenated: `(N,)` float32.

    Leaves must be float32, bfloat16 or float16 (upcast exactly); an empty
    tree gives a `(0,)` vector.
    """
    _layout(tree, "tree")
    leaves = [jnp.ravel(leaf).astype(jnp.float32) for leaf in jax.tree.leaves(tree)]
    return jnp.concatenate(leaves) if leaves else jnp.zeros((0,), jnp.float32)


def unflatten(vector: Array, like: PyTree) -> PyTree:
    """The inverse of `flatten`: `vector (N,)` as a pytree shaped like `like` (structure, dtypes).

    Raises:
      ValueError: when `vector` is not 1-D of the size of `like`.
    """
    return _unflatten(vector, _layout(like, "like"))


def global_norm(tree: PyTree) -> Array:
    """The L2 norm of all leaves of `tree` together (a scalar), as `optax.tree.norm` computes it.

    Summed over one concatenated vector: a single reduction instead of one per
    leaf. Low-precision leaves are upcast to float32; float64 leaves stay float64.
    """
    leaves = [jnp.ravel(leaf) for leaf in jax.tree.leaves(tree)]
    if not leaves:
        return jnp.zeros((), jnp.float32)
    vector = jnp.concatenate(leaves)
    vector = vector.astype(jnp.promote_types(vector.dtype, jnp.float32))
    return jnp.sqrt(jnp.sum(jnp.square(vector)))


def _unflatten(vector: Array, layout: _Layout) -> PyTree:
    if np.ndim(vector) != 1 or np.shape(vector)[0] != layout.size:
        raise ValueError(
            f"flat_adamw: expected a vector of shape ({layout.size},) for a tree of "
            f"{len(layout.sizes)} leaves, got shape {np.shape(vector)}"
        )
    leaves, offset = [], 0
    for shape, dtype, size in zip(layout.shapes, layout.dtypes, layout.sizes, strict=True):
        leaves.append(vector[offset : offset + size].reshape(shape).astype(dtype))
        offset += size
    return jax.tree.unflatten(layout.treedef, leaves)


def _mask_vector(mask: Any, tree: PyTree, layout: _Layout) -> np.ndarray:
    """The weight-decay mask as a constant `(N,)` bool vector.

    `mask` is a pytree of booleans with `tree`'s structure, or a prefix of it
    (one flag for a whole subtree), or a callable returning one from `tree`,
    as `optax.adamw(mask=...)` takes it. Its flags must be concrete Python or
    NumPy booleans (`_check_mask_flags`): they select parameters, not values.
    """
    flags = mask(tree) if callable(mask) else mask
    _check_mask_flags(flags, callable(mask))
    try:
        per_leaf = jax.tree.leaves(
            jax.tree.map(lambda flag, subtree: jax.tree.map(lambda _: flag, subtree), flags, tree)
        )
    except ValueError as error:
        top = f" (top-level keys {sorted(tree)})" if isinstance(tree, Mapping) else ""
        hint = (
            "; `tft_jax.train` optimizes {'params': params, **extra_params}, so a mask over "
            "the model's params alone is given as {'params': mask}"
            if isinstance(tree, Mapping) and "params" in tree
            else ""
        )
        raise ValueError(
            f"flat_adamw: the weight-decay mask must have the structure of the parameters"
            f"{top} (or a prefix of it){hint}: {error}"
        ) from error
    values = [bool(flag) for flag in per_leaf]  # each a bool or np.bool_, checked above
    return np.repeat(np.asarray(values, bool), np.asarray(layout.sizes, np.int64))


def _check_mask_flags(flags: Any, from_callable: bool) -> None:
    """Raises `TypeError` naming the path of a mask leaf that is not one concrete boolean.

    `bool(flag)` took any truthy value as "decay": a leaf "no" decayed its
    parameters, and a callable returning 5 decayed everything, both without
    a word. A Python bool or a concrete 0-d boolean array (NumPy or JAX, as
    `optax.adamw(mask=...)` takes) is one flag; a traced flag (a mask
    computed under `jax.jit`) selects nothing concrete, and an array of
    several flags is not one per leaf.
    """
    leaves, _ = jax.tree_util.tree_flatten_with_path(flags)
    for path, flag in leaves:
        if isinstance(flag, bool | np.bool_):
            continue
        concrete = isinstance(flag, np.ndarray | jax.Array) and not isinstance(
            flag, jax.core.Tracer
        )
        if concrete and flag.dtype == np.bool_ and flag.ndim == 0:
            continue
        where = jax.tree_util.keystr(path) or "(the whole mask)"
        source = " returned by the mask callable" if from_callable else ""
        kind = "a traced value" if isinstance(flag, jax.core.Tracer) else type(flag).__name__
        raise TypeError(
            f"flat_adamw: weight-decay mask leaves must be concrete booleans (Python bool or "
            f"np.bool_, one per parameter leaf or subtree), got {kind} {flag!r} at "
            f"{where}{source}"
        )


def flat_adamw(
    learning_rate: float | optax.Schedule | WarmupCosine,
    *,
    clip_norm: float | None = None,
    weight_decay: float = 0.0,
    mask: Any = None,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
) -> optax.GradientTransformationExtraArgs:
    """Clipping by global norm, then AdamW, on one flat float32 vector of the whole tree.

    Per scalar (`g` the gradient, `p` the parameter, `t` the update count
    after this update, `lr` the learning rate or `schedule(t - 1)`):

        g ← g · min(1, c / ||g||)     (only when ||g|| >= c; skipped if clip_norm is None)
        m ← b1 m + (1 - b1) g,   v ← b2 v + (1 - b2) g²
        u = m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd · p   (wd · p where masked in)
        update = -lr · u

    which is `optax.chain(optax.clip_by_global_norm(c), optax.adamw(lr, b1, b2,
    eps, weight_decay=wd, mask=mask))` to float32 rounding (the norm sums in
    another order): clipping sees the raw gradients only, and the decay term,
    added after the Adam scaling, is never clipped.

    Args:
      learning_rate: a float, or an optax schedule `count -> lr` called with
        the number of updates before this one. A `WarmupCosine` is kept in
        the state (`FlatAdamWState.schedule`, four float32 scalars) and
        evaluated from there, so the compiled update does not depend on its
        numbers; a float or any other callable is compiled in as constants.
      clip_norm: the global-norm threshold `c`; None disables clipping.
      weight_decay: the decoupled weight decay coefficient `wd`.
      mask: which parameters decay, as `optax.adamw(mask=...)`: a pytree of
        concrete booleans with the parameters' structure (or a prefix of
        it), or a callable returning one from the gradient tree. None: all.
      b1, b2, eps: Adam's constants (optax's defaults).

    The numbers may also be traced scalars (`optax.inject_hyperparams(flat_adamw)`
    under `jax.jit`): their ranges are then not checked.

    Returns:
      An `optax.GradientTransformationExtraArgs` whose state is a
      `FlatAdamWState` of two `(N,)` float32 vectors, a count and the
      schedule (None unless `learning_rate` is a `WarmupCosine`). Its
      `update` compares equal to that of any `flat_adamw` with equal
      arguments, a `WarmupCosine`'s numbers aside (a mask that is not
      hashable counts by identity); `init` also compares those numbers. `update`
      takes `(grads, state, params)` (`params` required when `weight_decay >
      0`) and returns the updates with the gradients' structure and dtypes.
      Leaves must be float32, bfloat16 or float16; the moments and the math
      are float32 for all of them (optax would keep bfloat16 moments for
      bfloat16 leaves).

    References:
      Pascanu et al., On the difficulty of training recurrent neural networks, 2013.
      Kingma & Ba, Adam: A method for stochastic optimization, ICLR 2015.
      Loshchilov & Hutter, Decoupled weight decay regularization, ICLR 2019.

    Example:
      >>> import jax.numpy as jnp
      >>> tx = flat_adamw(0.1, clip_norm=1.0)
      >>> params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
      >>> state = tx.init(params)
      >>> state.mu.shape
      (9,)
      >>> updates, state = tx.update(params, state, params)
      >>> updates["w"].shape
      (2, 3)
    """

    _check_hyperparameters(learning_rate, clip_norm, weight_decay, b1, b2, eps)
    if not callable(learning_rate):
        learning_rate = _hyperparameter(learning_rate)
    clip_norm = None if clip_norm is None else _hyperparameter(clip_norm)
    weight_decay, b1, b2, eps = (_hyperparameter(value) for value in (weight_decay, b1, b2, eps))
    hyper = _Hyper(
        learning_rate=_IN_STATE if isinstance(learning_rate, WarmupCosine) else learning_rate,
        clip_norm=clip_norm,
        weight_decay=weight_decay,
        mask=static_argument(mask),
        b1=b1,
        b2=b2,
        eps=eps,
    )
    # Python floats: hashable (`init` compares them), turned into float32 by `init`.
    schedule = (
        jax.tree.map(float, learning_rate) if isinstance(learning_rate, WarmupCosine) else None
    )
    return optax.GradientTransformationExtraArgs(_Init(hyper, schedule), _Update(hyper))


def _hyperparameter(value: Any) -> Any:
    """A checked setting as the update uses it: a Python float, or a traced float32 scalar.

    Python floats (weakly typed in the math): a NumPy or JAX float64 scalar
    would otherwise, under `jax.enable_x64`, promote the float32 moments and
    update vectors to float64, and a JAX array would make `update` unhashable.
    A traced one (`optax.inject_hyperparams` under `jax.jit`) has no value
    yet: float32, for the same reason.
    """
    if isinstance(value, jax.core.Tracer):
        return value.astype(jnp.float32)
    return float(value)


def _check_hyperparameters(
    learning_rate: Any, clip_norm: Any, weight_decay: Any, b1: Any, b2: Any, eps: Any
) -> None:
    """Raises `ValueError` naming the first setting out of its range.

    Each would make the update non-finite or wrong without an error: a NaN
    or negative rate, `eps = 0` (a parameter whose gradients have all been
    0 gets `0 / 0`), `b1` or `b2` of 1 (the bias correction divides by 0).
    A traced setting (`optax.inject_hyperparams` under `jax.jit`) has no
    value to check: only that it is a real scalar.
    """

    def as_float(value: Any) -> float | None:
        """`value` as a float if it is a real scalar (NumPy and JAX ones too), else None."""
        if value is None or isinstance(value, bool | np.bool_ | str | bytes):
            return None
        try:
            return float(value) if np.ndim(value) == 0 else None
        except (TypeError, ValueError):
            return None

    def require(name: str, value: Any, ok: Callable[[float], bool], expected: str) -> None:
        if isinstance(value, jax.core.Tracer):
            dtype = value.dtype
            real = jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)
            if value.ndim == 0 and real:
                return
            raise ValueError(
                f"flat_adamw: {name} must be {expected}: a real scalar, got a traced array of "
                f"shape {value.shape} and dtype {dtype}"
            )
        number = as_float(value)
        if number is None or not ok(number):
            raise ValueError(f"flat_adamw: {name} must be {expected}, got {value!r}")

    finite = math.isfinite
    if isinstance(learning_rate, WarmupCosine):
        _check_warmup_cosine(learning_rate)
    elif not callable(learning_rate):
        require(
            "learning_rate",
            learning_rate,
            lambda x: finite(x) and x >= 0,
            "a finite float >= 0 or a schedule",
        )
    if clip_norm is not None:
        require("clip_norm", clip_norm, lambda x: finite(x) and x > 0, "a finite float > 0 or None")
    require("weight_decay", weight_decay, lambda x: finite(x) and x >= 0, "a finite float >= 0")
    for name, beta in (("b1", b1), ("b2", b2)):
        require(name, beta, lambda x: 0.0 <= x < 1.0, "a float in [0, 1)")
    require("eps", eps, lambda x: finite(x) and x > 0, "a finite float > 0")


def _check_warmup_cosine(schedule: WarmupCosine) -> None:
    """Raises `ValueError` unless `schedule`'s numbers make a finite rate >= 0 at every step.

    A `WarmupCosine` built directly (not by `tft_jax.train.warmup_cosine_schedule`)
    is not checked on construction; with `total_steps <= warmup_steps` its
    cosine divides by a span <= 0 and the rate after the warmup is NaN (optax's
    `warmup_cosine_decay_schedule` refuses such a schedule), which in the
    state would silently turn every update after the warmup into NaN.
    """
    try:
        peak, total, warmup, end = (float(value) for value in jax.tree.leaves(schedule))
    except (TypeError, ValueError):
        peak = total = warmup = end = math.nan
    numbers = (peak, total, warmup, end)
    if not (all(math.isfinite(x) and x >= 0 for x in numbers) and warmup < total):
        raise ValueError(
            "flat_adamw: learning_rate must be a WarmupCosine of finite numbers >= 0 with "
            f"warmup_steps < total_steps, got {schedule!r}"
        )


def _may_be_nonzero(value: Any) -> bool:
    """Whether a hyperparameter may be nonzero: a traced one may, a concrete one if it is."""
    return isinstance(value, jax.core.Tracer) or value != 0


def is_flat_adamw(tx: Any) -> bool:
    """Whether `tx` is a `flat_adamw` (as `tft_jax.train.make_optimizer` builds), not wrapped."""
    return isinstance(getattr(tx, "update", None), _Update)


def flat_updates(
    tx: Any,
    grads: PyTree,
    state: FlatAdamWState,
    params: PyTree | None = None,
    *,
    flat_grads: Array | None = None,
    grad_norm: Array | None = None,
) -> tuple[Array, FlatAdamWState]:
    """A `flat_adamw`'s `update` before it is split into the tree: `(updates (N,), new state)`.

    `unflatten(updates, grads)` is what `tx.update(grads, state, params)`
    returns. `tft_jax.train.train_step` applies the vector outside its
    skip-step conditional, which then carries three vectors instead of every
    parameter leaf.

    Args:
      tx, grads, state, params: as for `tx.update`.
      flat_grads: `flatten(grads)` `(N,)`, when the caller has it already.
      grad_norm: its L2 norm (a scalar), likewise; used for clipping.
        Both serve a caller that computed them before a `lax.cond`, across
        which XLA cannot share the concatenation and the reduction.

    Raises:
      TypeError: `tx` is not a `flat_adamw` (`is_flat_adamw`).
      ValueError: `flat_grads` does not have the shape `(N,)` of `grads`, or
        `grad_norm` is not a scalar.
    """
    if not is_flat_adamw(tx):
        raise TypeError(f"flat_updates: tx must be a flat_adamw, got {type(tx).__name__}")
    return tx.update.flat(grads, state, params, flat_grads=flat_grads, grad_norm=grad_norm)


def scheduled_learning_rate(tx: Any, state: Any) -> Array | None:
    """The learning rate of `tx`'s next update, when `tx` is a `flat_adamw` with a schedule.

    A float32 scalar computed from `state` (a `FlatAdamWState`); None when
    the rate is a constant (checked when the optimizer was built) or `tx`
    is another transformation. With finite gradients (and the settings
    `flat_adamw` checks), its update is finite exactly when this rate is:
    `tft_jax.train.train_step` reads it to skip a step whose scheduled rate
    is NaN, inf or negative instead of applying it.
    """
    if not is_flat_adamw(tx) or not isinstance(state, FlatAdamWState):
        return None
    rate = tx.update.hyper.learning_rate
    if rate is not _IN_STATE and not callable(rate):
        return None
    return jnp.asarray(tx.update._learning_rate(state), jnp.float32)


# The learning rate of a `_Hyper` whose schedule lives in the state (compared by identity).
_IN_STATE: Any = object()


@dataclasses.dataclass(frozen=True)
class _Hyper:
    """The settings of one `flat_adamw`: equal settings give equal (hashable) functions.

    `learning_rate` is a float or a schedule compiled into the step, or
    `_IN_STATE` for a `WarmupCosine` read from `FlatAdamWState.schedule`;
    `mask` as given, or wrapped by `static_argument`. Under
    `optax.inject_hyperparams` and `jax.jit` the numbers may be traced
    float32 scalars (such settings are neither hashed nor compared).
    """

    learning_rate: Any
    clip_norm: float | None
    weight_decay: float
    mask: Any
    b1: float
    b2: float
    eps: float

    @property
    def decay_mask(self) -> Any:
        return from_static_argument(self.mask)


@dataclasses.dataclass(frozen=True)
class _Init:
    """`flat_adamw`'s `init`: zero moments, count 0, the schedule's numbers if in the state.

    The schedule's numbers are part of equality: `jax.jit(init)` traces once
    per equal `init`, and the numbers are constants of that trace.
    """

    hyper: _Hyper
    schedule: WarmupCosine | None

    def __call__(self, params: PyTree) -> FlatAdamWState:
        layout = _layout(params, "params")
        size = layout.size
        if _may_be_nonzero(self.hyper.weight_decay) and self.hyper.decay_mask is not None:
            _mask_vector(self.hyper.decay_mask, params, layout)  # a wrong mask fails here, named
        return FlatAdamWState(
            count=jnp.zeros((), jnp.int32),
            mu=jnp.zeros((size,), jnp.float32),
            nu=jnp.zeros((size,), jnp.float32),
            schedule=None if self.schedule is None else self.schedule.as_arrays(),
        )


@dataclasses.dataclass(frozen=True)
class _Update:
    """`flat_adamw`'s `update(grads, state, params=None)`."""

    hyper: _Hyper

    def __call__(
        self, grads: PyTree, state: FlatAdamWState, params: PyTree | None = None, **extra_args: Any
    ) -> tuple[PyTree, FlatAdamWState]:
        del extra_args
        vector, new_state = self.flat(grads, state, params)
        return _unflatten(vector, _layout(grads, "grads")), new_state

    def flat(
        self,
        grads: PyTree,
        state: FlatAdamWState,
        params: PyTree | None = None,
        *,
        flat_grads: Array | None = None,
        grad_norm: Array | None = None,
    ) -> tuple[Array, FlatAdamWState]:
        """The update as one `(N,)` float32 vector in `flatten`'s order, and the new state.

        `flat_grads` and `grad_norm`: `flatten(grads)` and its norm, if the caller has them.
        """
        hyper = self.hyper
        layout = _layout(grads, "grads")
        if np.shape(state.mu) != (layout.size,):
            raise ValueError(
                f"flat_adamw: the gradients hold {layout.size} scalars but the optimizer "
                f"state was initialized for {np.shape(state.mu)}"
            )
        if flat_grads is None:
            g = flatten(grads)
        elif np.shape(flat_grads) != (layout.size,):
            raise ValueError(
                f"flat_adamw: flat_grads must be flatten(grads) of shape ({layout.size},), "
                f"got shape {np.shape(flat_grads)}"
            )
        else:
            g = jnp.asarray(flat_grads, jnp.float32)
        if grad_norm is not None and np.shape(grad_norm) != ():
            # An (N,) "norm" would broadcast into an elementwise clipping factor.
            raise ValueError(
                f"flat_adamw: grad_norm must be a scalar, got shape {np.shape(grad_norm)}"
            )
        if hyper.clip_norm is not None:
            # One scalar factor, so that the moment updates read `g` once: a
            # vector select between `g` and the clipped `g` made XLA write the
            # clipped vector out and read both.
            norm = global_norm(g) if grad_norm is None else grad_norm
            g = g * jnp.where(norm < hyper.clip_norm, 1.0, hyper.clip_norm / norm)
        mu = (1 - hyper.b1) * g + hyper.b1 * state.mu
        nu = (1 - hyper.b2) * (g**2) + hyper.b2 * state.nu
        count = optax.safe_increment(state.count)
        mu_hat = mu / (1 - hyper.b1**count).astype(jnp.float32)
        nu_hat = nu / (1 - hyper.b2**count).astype(jnp.float32)
        direction = mu_hat / (jnp.sqrt(nu_hat) + hyper.eps)
        if _may_be_nonzero(hyper.weight_decay):
            direction = self._add_decay(direction, grads, params, layout)
        direction = -self._learning_rate(state) * direction
        return direction, state._replace(count=count, mu=mu, nu=nu)

    def _learning_rate(self, state: FlatAdamWState) -> Any:
        """The learning rate of this update: a float, or a float32 scalar from the count."""
        learning_rate = self.hyper.learning_rate
        if learning_rate is _IN_STATE:
            if not isinstance(state.schedule, WarmupCosine):
                raise ValueError(
                    "flat_adamw: built with a WarmupCosine learning rate, whose numbers live "
                    f"in the state, but state.schedule is {state.schedule!r}; initialize the "
                    "state with this optimizer's init"
                )
            return state.schedule(state.count).astype(jnp.float32)
        if callable(learning_rate):
            return jnp.asarray(learning_rate(state.count), jnp.float32)
        return learning_rate

    def _add_decay(
        self, direction: Array, grads: PyTree, params: PyTree | None, layout: _Layout
    ) -> Array:
        """`direction + wd · p` where the mask decays, `direction` elsewhere."""
        if params is None:
            raise ValueError("flat_adamw: weight_decay > 0 needs params in update(...)")
        if jax.tree.structure(params) != layout.treedef:
            raise ValueError(
                f"flat_adamw: params must have the structure of the gradients, got "
                f"{jax.tree.structure(params)} and {layout.treedef}"
            )
        shapes = _layout(params, "params").shapes
        if shapes != layout.shapes:
            # Same structure, other shapes: the flat vectors would misalign (a
            # broadcasting error deep in the step, or, with equal sizes, every
            # parameter decayed by another's value).
            raise ValueError(
                f"flat_adamw: params must have the shapes of the gradients, got leaf shapes "
                f"{list(shapes)} for gradients of {list(layout.shapes)}"
            )
        decayed = direction + self.hyper.weight_decay * flatten(params)
        mask = self.hyper.decay_mask
        if mask is None:
            return decayed
        flags = _mask_vector(mask, grads, layout)
        if flags.all():
            return decayed
        if not flags.any():
            return direction
        return jnp.where(flags, decayed, direction)
