"""`tft_jax.atomic_files.interrupts_held`: a Ctrl-C within the block waits for its end.

The interrupt is a real SIGINT (`signal.raise_signal`), handled as Python handles
the user's Ctrl-C; the handler in place before the block is checked to be back.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from tft_jax.atomic_files import interrupts_held


def test_a_ctrl_c_within_the_block_is_raised_once_the_block_has_run_to_its_end() -> None:
    before = signal.getsignal(signal.SIGINT)
    done = []
    with pytest.raises(KeyboardInterrupt), interrupts_held():
        signal.raise_signal(signal.SIGINT)
        done.append("after the interrupt")
    assert done == ["after the interrupt"]
    assert signal.getsignal(signal.SIGINT) is before


def test_a_block_without_an_interrupt_raises_nothing_and_restores_the_handler() -> None:
    before = signal.getsignal(signal.SIGINT)
    with interrupts_held():
        pass
    assert signal.getsignal(signal.SIGINT) is before


def test_an_error_that_ends_the_block_goes_on_instead_of_the_held_interrupt() -> None:
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(OSError, match="rename failed"), interrupts_held():
        signal.raise_signal(signal.SIGINT)
        raise OSError("rename failed")
    assert signal.getsignal(signal.SIGINT) is before


def test_nested_blocks_hand_the_interrupt_to_the_outer_one() -> None:
    done = []
    with pytest.raises(KeyboardInterrupt), interrupts_held():
        with interrupts_held():
            signal.raise_signal(signal.SIGINT)
            done.append("inner")
        done.append("outer")
    assert done == ["inner", "outer"]


def test_outside_the_main_thread_the_block_runs_as_it_is() -> None:
    # Python runs signal handlers in the main thread only: nothing to hold there.
    outcome = []

    def run() -> None:
        with interrupts_held():
            outcome.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert outcome == [signal.getsignal(signal.SIGINT)]


def test_a_sigterm_held_when_an_error_ends_the_block_still_ends_the_process() -> None:
    # The error went on and the held SIGTERM was dropped: a caller that caught the failed
    # save's error outlived the scheduler's kill request.
    script = textwrap.dedent(
        """
        import os, signal
        from tft_jax.atomic_files import interrupts_held
        try:
            with interrupts_held():
                os.kill(os.getpid(), signal.SIGTERM)
                raise OSError("a rename failed")
        except OSError:
            print("caught", flush=True)
        print("alive", flush=True)
        """
    )
    ended = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert ended.returncode == -signal.SIGTERM, (ended.stdout, ended.stderr)
    assert "alive" not in ended.stdout
