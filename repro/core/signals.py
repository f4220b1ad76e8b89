"""SIGTERM and SIGHUP stop the tool the way Ctrl-C does.

`timeout`, a CI cancel and a closed terminal send SIGTERM or SIGHUP, not SIGINT. Python's default
for those is to die at once, which skips every `finally`/`except KeyboardInterrupt` that stops
the suite's process group, removes the container and deletes the half-built venv. Turning them
into KeyboardInterrupt sends them down the one path that is already tested for Ctrl-C.

Only the first signal interrupts: a second one while that path is cleaning up (a CI runner often
repeats SIGTERM) is reported and ignored, so the clean-up itself is not cut short. SIGKILL remains
the way to stop the tool without clean-up.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class _Handler:
    def __init__(self) -> None:
        self.received: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            print(
                f"{signal.Signals(signum).name}: already stopping; waiting for the clean-up",
                file=sys.stderr,
                flush=True,
            )
            return
        self.received = signum
        raise KeyboardInterrupt(signal.Signals(signum).name)


def install_stop_handlers() -> None:
    """Make SIGTERM/SIGHUP raise KeyboardInterrupt in the main thread (once).

    A signal the parent set to ignored (`nohup` ignores SIGHUP) stays ignored: the user asked for it.
    Outside the main thread Python cannot install handlers, and nothing is changed.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    handler = _Handler()
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue
        signal.signal(sig, handler)
