"""An independent float64 NumPy Temporal Fusion Transformer, written from the paper's equations.

Lim et al., "Temporal Fusion Transformers for interpretable multi-horizon
time series forecasting" (IJF 2021); equation numbers below are the paper's.
Nothing here calls project code: every function reads a Flax parameter tree
(nested dicts, by the names the model gives its layers) and computes in
float64 with plain NumPy, one variable, one head and one time step at a time
where that is the clearest way to write the equation. The tests compare the
Flax model with it (`tests/test_reference_tft.py`, `tests/test_reference_modules.py`).

Conventions read from the parameter tree (not from the model's code):
  - a dense layer is `{kernel (I, F)[, bias (F,)]}`, `y = x @ kernel + bias`;
  - a per-variable layer stacks one dense layer per variable along a leading
    axis (`kernel (V, I, F)`, `bias (V, F)`);
  - the GLU's two halves (eq. 5) are one `projection` to `2F`: the first `F`
    columns are `W4 x + b4`, the last `F` the gate `W5 x + b5`;
  - an LSTM's `input` layer (with bias) and `cell/recurrent` layer (no bias)
    produce the four gates as column blocks in the order input, forget,
    candidate, output;
  - the number of attention heads is `D / head_dim`, `head_dim` being the
    width of the shared `value` projection.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

LAYER_NORM_EPSILON = 1e-6

Params = Mapping[str, Any]


def to_float64(tree: Any) -> Any:
    """A nested mapping of arrays (a Flax variable dict) as nested dicts of float64 arrays."""
    if isinstance(tree, Mapping):
        return {key: to_float64(value) for key, value in tree.items()}
    return np.asarray(tree, np.float64)


# ---------------------------------------------------------------------------
# Elementwise functions


def elu(x: np.ndarray) -> np.ndarray:
    """ELU with alpha 1: `x` for `x > 0`, else `exp(x) - 1`."""
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0.0)))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function, written through tanh (no overflow for large |x|)."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    shifted = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return shifted / np.sum(shifted, axis=axis, keepdims=True)


# ---------------------------------------------------------------------------
# Layers


def dense(x: np.ndarray, p: Params) -> np.ndarray:
    """`x @ W + b` over the last axis (no bias when the layer has none)."""
    y = np.asarray(x, np.float64) @ p["kernel"]
    return y + p["bias"] if "bias" in p else y


def layer_norm(x: np.ndarray, p: Params, epsilon: float = LAYER_NORM_EPSILON) -> np.ndarray:
    """`(x - mean) / sqrt(var + eps) * scale + bias` over the last axis (biased variance)."""
    mean = x.mean(axis=-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * p["scale"] + p["bias"]


def glu(x: np.ndarray, p: Params) -> np.ndarray:
    """Eq. 5: `GLU(γ) = (W4 γ + b4) ⊙ σ(W5 γ + b5)` (dropout off)."""
    projected = dense(x, p["projection"])
    features = projected.shape[-1] // 2
    return projected[..., :features] * sigmoid(projected[..., features:])


def gate_add_norm(x: np.ndarray, skip: np.ndarray, p: Params) -> np.ndarray:
    """The gated skip connection: `LayerNorm(skip + GLU(x))` (eq. 2, 17, 18, 22)."""
    return layer_norm(skip + glu(x, p["glu"]), p["layer_norm"])


def grn(x: np.ndarray, p: Params, context: np.ndarray | None = None) -> np.ndarray:
    """Eq. 2-4, the gated residual network.

    `η2 = ELU(W2 a + W3 c + b2)`, `η1 = W1 η2 + b1`,
    `GRN(a, c) = LayerNorm(skip(a) + GLU(η1))`; `skip` is the identity when
    input and output widths agree, else the learned `skip` layer; `W3` (no
    bias) is there only with a context. `x`: `(B, ..., I)`; `context`:
    `(B, C)`, the same for every other axis of `x`.
    """
    x = np.asarray(x, np.float64)
    eta = dense(x, p["input"])
    if context is not None:
        projected = dense(context, p["context"])  # (B, hidden)
        eta = eta + projected.reshape(projected.shape[:1] + (1,) * (x.ndim - 2) + (-1,))
    eta = dense(elu(eta), p["hidden"])
    skip = dense(x, p["skip"]) if "skip" in p else x
    return gate_add_norm(eta, skip, p["gate_add_norm"])


def _variable_slice(p: Params, index: int) -> dict[str, Any]:
    """Variable `index`'s own GRN from a stack of per-variable GRNs.

    Every per-variable leaf has the variable axis first; the context layer of
    a one-variable network is a single ordinary dense layer and is kept whole.
    """

    def take(tree: Any) -> Any:
        if isinstance(tree, Mapping):
            return {key: take(value) for key, value in tree.items()}
        return tree[index]

    return {key: (value if key == "context" else take(value)) for key, value in p.items()}


def variable_selection(
    embedded: np.ndarray, p: Params, context: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 6-8, the variable selection network.

    `embedded (B, [T,] V, width)` -> `(combined (B, [T,] D), weights (B, [T,] V))`.
    Each variable `j` gets its own GRN, `ξ̃_j = GRN_j(ξ_j)`; the weights are
    `softmax(GRN_v(Ξ, c))` over the flattened embeddings `Ξ`; the output is
    `Σ_j v_j ξ̃_j`. With one variable the weight is 1 and the context
    conditions that variable's own GRN instead (the project's documented
    choice: the context must act somewhere).
    """
    embedded = np.asarray(embedded, np.float64)
    num_variables = embedded.shape[-2]
    single = num_variables == 1
    processed = [
        grn(
            embedded[..., index, :],
            _variable_slice(p["variable_grns"], index),
            context if single else None,
        )
        for index in range(num_variables)
    ]
    if single:
        weights = np.ones(embedded.shape[:-1])
    else:
        flat = embedded.reshape(*embedded.shape[:-2], -1)
        weights = softmax(grn(flat, p["selection_grn"], context), axis=-1)
    combined = sum(weights[..., index, None] * processed[index] for index in range(num_variables))
    return combined, weights


def real_embedding(x: np.ndarray, p: Params) -> np.ndarray:
    """Each real variable `v` gets its own linear map: `(..., V) -> (..., V, width)`."""
    x = np.asarray(x, np.float64)
    prescaler = p["prescaler"]
    columns = [
        x[..., index, None] * prescaler["kernel"][index, 0] + prescaler["bias"][index]
        for index in range(x.shape[-1])
    ]
    return np.stack(columns, axis=-2)


def categorical_embedding(codes: np.ndarray, p: Params) -> np.ndarray:
    """Column `i` of the integer codes looks up table `embedding_i`: `(B, C) -> (B, C, width)`."""
    codes = np.asarray(codes)
    return np.stack(
        [p[f"embedding_{index}"][codes[:, index]] for index in range(codes.shape[1])], axis=1
    )


def lstm(
    inputs: np.ndarray, p: Params, state: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """A one-layer LSTM, one step at a time (Hochreiter & Schmidhuber; the usual form).

    `i = σ(W_i x + U_i h + b_i)`, `f = σ(W_f x + U_f h + b_f)`,
    `g = tanh(W_g x + U_g h + b_g)`, `o = σ(W_o x + U_o h + b_o)`,
    `c' = f ⊙ c + i ⊙ g`, `h' = o ⊙ tanh(c')`.
    `inputs (B, T, I)`, `state = (h, c)` each `(B, D)` (zeros when None).
    Returns `(outputs (B, T, D), (h_T, c_T))`.
    """
    inputs = np.asarray(inputs, np.float64)
    w_x, bias = p["input"]["kernel"], p["input"]["bias"]
    w_h = p["cell"]["recurrent"]["kernel"]
    features = w_h.shape[0]
    if state is None:
        h = np.zeros((inputs.shape[0], features))
        c = np.zeros((inputs.shape[0], features))
    else:
        h, c = (np.asarray(s, np.float64) for s in state)

    def block(z: np.ndarray, k: int) -> np.ndarray:
        return z[..., k * features : (k + 1) * features]

    outputs = []
    for step in range(inputs.shape[1]):
        z = inputs[:, step] @ w_x + h @ w_h + bias
        i, f = sigmoid(block(z, 0)), sigmoid(block(z, 1))
        g, o = np.tanh(block(z, 2)), sigmoid(block(z, 3))
        c = f * c + i * g
        h = o * np.tanh(c)
        outputs.append(h)
    return np.stack(outputs, axis=1), (h, c)


def decoder_mask(num_queries: int, num_keys: int, attend_to_self: bool) -> np.ndarray:
    """Query `i` sits at step `num_keys - num_queries + i`; it sees the steps before it
    (and itself with `attend_to_self`). True = may attend."""
    allowed = np.zeros((num_queries, num_keys), bool)
    for query in range(num_queries):
        position = num_keys - num_queries + query
        for key in range(num_keys):
            allowed[query, key] = key < position or (attend_to_self and key == position)
    return allowed


def interpretable_attention(
    queries: np.ndarray, keys_values: np.ndarray, p: Params, attend_to_self: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 13-16, interpretable multi-head attention with the decoder mask.

    Head `h`: `A_h = softmax(Q W_Q^h (K W_K^h)^T / sqrt(d_attn))` (masked),
    `H_h = A_h V W_V` with one value projection `W_V` shared by every head;
    `InterpretableMultiHead = (1/m Σ_h H_h) W_H`. No biases. `W_Q^h`, `W_K^h`
    are the columns `h·d:(h+1)·d` of the `query` and `key` kernels.
    Returns `(output (B, Tq, D), weights (B, heads, Tq, Tk))`.
    """
    head_dim = p["value"]["kernel"].shape[1]
    num_heads = p["query"]["kernel"].shape[1] // head_dim
    batch, num_queries, _ = queries.shape
    num_keys = keys_values.shape[1]
    allowed = decoder_mask(num_queries, num_keys, attend_to_self)
    values = keys_values @ p["value"]["kernel"]  # (B, Tk, d)
    weights = np.zeros((batch, num_heads, num_queries, num_keys))
    heads = np.zeros((batch, num_heads, num_queries, head_dim))
    for head in range(num_heads):
        columns = slice(head * head_dim, (head + 1) * head_dim)
        q = queries @ p["query"]["kernel"][:, columns]
        k = keys_values @ p["key"]["kernel"][:, columns]
        for b in range(batch):
            for query in range(num_queries):
                keys = np.flatnonzero(allowed[query])
                scores = k[b, keys] @ q[b, query] / np.sqrt(head_dim)
                weights[b, head, query, keys] = softmax(scores)
                heads[b, head, query] = weights[b, head, query] @ values[b]
    output = heads.mean(axis=1) @ p["out"]["kernel"]
    return output, weights


# ---------------------------------------------------------------------------
# The whole model


CONTEXTS = ("selection", "enrichment", "state_h", "state_c")


def tft_forward(
    params: Params,
    static: np.ndarray | None,
    historical: np.ndarray,
    future: np.ndarray,
    known_history: np.ndarray | None = None,
    static_categorical: np.ndarray | None = None,
    *,
    attend_to_self: bool = True,
    intermediates: bool = False,
) -> dict[str, np.ndarray]:
    """The TFT forward (dropout off) from the paper's equations.

    `params` is the model's `variables['params']` (any float dtype).
    Returns a dict with `quantiles (B, H, Q)`, `attention (B, heads, H, T+H)`,
    `static_weights (B, S+C)`, `history_weights (B, T, U[+K])`,
    `future_weights (B, H, K)`; with `intermediates`, also the static
    contexts (`context_<name>`), the LSTM outputs and states, and the
    tensors between blocks.
    """
    p = to_float64(params)
    historical = np.asarray(historical, np.float64)
    batch, steps = historical.shape[:2]
    out: dict[str, np.ndarray] = {}

    # Static covariate encoders (sec. 4.3): selection over the statics, then four GRNs.
    parts = []
    if static is not None and np.shape(static)[-1] > 0:
        parts.append(real_embedding(static, p["static_embedding"]))
    if static_categorical is not None and np.shape(static_categorical)[-1] > 0:
        parts.append(categorical_embedding(static_categorical, p["static_categorical_embedding"]))
    contexts: dict[str, np.ndarray | None] = dict.fromkeys(CONTEXTS)
    if parts:
        static_encoding, static_weights = variable_selection(
            np.concatenate(parts, axis=1), p["static_selection"]
        )
        for name in CONTEXTS:
            contexts[name] = grn(static_encoding, p[f"static_context_{name}"])
            out[f"context_{name}"] = contexts[name]
    else:
        static_weights = np.zeros((batch, 0))

    # Variable selection over the past (observed [+ known]) and the future (known) inputs.
    history_embedded = real_embedding(historical, p["observed_embedding"])
    if known_history is not None:
        history_embedded = np.concatenate(
            [history_embedded, real_embedding(known_history, p["known_embedding"])], axis=-2
        )
    history, history_weights = variable_selection(
        history_embedded, p["history_selection"], contexts["selection"]
    )
    horizon, future_weights = variable_selection(
        real_embedding(future, p["known_embedding"]), p["future_selection"], contexts["selection"]
    )

    # Sequence-to-sequence layer (eq. 17): encoder seeded with (c_h, c_c), decoder with its state.
    seed = None if contexts["state_h"] is None else (contexts["state_h"], contexts["state_c"])
    encoded, encoder_state = lstm(history, p["encoder"], seed)
    decoded, _ = lstm(horizon, p["decoder"], encoder_state)
    temporal = gate_add_norm(
        np.concatenate([encoded, decoded], axis=1),
        np.concatenate([history, horizon], axis=1),
        p["lstm_gate"],
    )

    # Static enrichment (eq. 18), attention (eq. 19-20), position-wise GRN and output (eq. 21-23).
    enriched = grn(temporal, p["static_enrichment"], contexts["enrichment"])
    attended, attention = interpretable_attention(
        enriched[:, steps:], enriched, p["attention"], attend_to_self
    )
    gated = gate_add_norm(attended, enriched[:, steps:], p["attention_gate"])
    features = grn(gated, p["positionwise_grn"])
    features = gate_add_norm(features, temporal[:, steps:], p["output_gate"])
    out.update(
        quantiles=dense(features, p["quantile_head"]),
        attention=attention,
        static_weights=static_weights,
        history_weights=history_weights,
        future_weights=future_weights,
    )
    if intermediates:
        out.update(
            history_encoding=history,
            future_encoding=horizon,
            encoded=encoded,
            decoded=decoded,
            encoder_h=encoder_state[0],
            encoder_c=encoder_state[1],
            temporal=temporal,
            enriched=enriched,
            attended=gated,
            decoded_features=features,
        )
    return out


OUTPUT_FIELDS = ("quantiles", "attention", "static_weights", "history_weights", "future_weights")
