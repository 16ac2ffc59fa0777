"""`benchmarks.peer`: the PyTorch peer takes its first (untimed) step when built, as ours does."""

from __future__ import annotations

import importlib.util

import pytest

from benchmarks import train_step


@pytest.mark.peers
@pytest.mark.skipif(
    importlib.util.find_spec("pytorch_forecasting") is None, reason="needs the 'peers' extra"
)
def test_peer_takes_its_first_step_untimed_when_built():
    from benchmarks import peer

    step = peer.PeerStep(train_step.get_config("tiny"))
    # Adam's state exists only after a step: the first call is not left to the timed ones.
    assert len(step.optimizer.state) > 0
    assert step.first_call_s > 0.0
