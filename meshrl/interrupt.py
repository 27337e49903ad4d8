"""Ctrl-C that one press is enough for.

Python raises KeyboardInterrupt wherever the main thread is when SIGINT arrives; raised inside a
finalizer or a callback that C code runs (a weakref callback, ``__del__``), it is printed as
"Exception ignored" and dropped, and the run goes on. ``meshrl`` installs ``on_sigint``, which also
records the press, and the engine's step loop calls ``check`` before each step (runtime/engine.py),
so a dropped interrupt still stops the run at the next step, through the same path (exit 130, the
checkpoint named: commands/train.py).
"""

from __future__ import annotations

import signal
import threading

_pressed = threading.Event()


def on_sigint(signum, frame) -> None:
    _pressed.set()
    raise KeyboardInterrupt


def install():
    """In the main thread of the process that runs a ``meshrl`` command: Ctrl-C is recorded, then
    raised. Returns the handler it replaced (None off the main thread), for ``restore``."""
    _pressed.clear()
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, on_sigint)


def restore(previous) -> None:
    """Put back the SIGINT handler ``install`` replaced (a command run from Python, a test)."""
    if previous is not None:
        signal.signal(signal.SIGINT, previous)


def check() -> None:
    """KeyboardInterrupt if Ctrl-C was pressed since ``install`` (a step boundary asks)."""
    if _pressed.is_set():
        raise KeyboardInterrupt
