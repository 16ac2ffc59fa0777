"""Random inputs shared by the building-block tests (GRN, LSTM, embeddings, attention flags).

`_X (B, T, I)` and a context `_CONTEXT (B, C)` are drawn at import from
`_RNG`, which the attention-flag tests draw from further.
"""

from __future__ import annotations

import numpy as np

_RNG = np.random.default_rng(0)
_X = _RNG.normal(size=(2, 3, 4)).astype(np.float32)  # (B, T, I)
_CONTEXT = _RNG.normal(size=(2, 5)).astype(np.float32)  # (B, C)
