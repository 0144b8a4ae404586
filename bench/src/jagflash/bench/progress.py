"""A progress bar on stderr, no dependency: redrawn in place on a terminal, one line per finished
row in a log (so a tee'd log doubles as a trace of what ran and what it measured)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m:02d}:{s:02d}"


class Progress:
    def __init__(self, total: int, done: int = 0, stream: TextIO | None = None, width: int = 24):
        self.total = max(total, 1)
        self.done = done
        self.stream = stream or sys.stderr
        self.width = width
        self.t0 = time.monotonic()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def _bar(self) -> str:
        filled = int(self.width * min(self.done, self.total) / self.total)
        return "[" + "#" * filled + "." * (self.width - filled) + f"] {self.done:>4}/{self.total}"

    def working(self, what: str) -> None:
        """Show what runs now (terminal only: a log gets the finished line instead)."""
        if self.tty:
            line = f"{self._bar()} {_clock(time.monotonic() - self.t0)} {what}"
            self.stream.write("\r\x1b[K" + line[:160])
            self.stream.flush()

    def advance(self, what: str, n: int = 1) -> None:
        self.done += n
        line = f"{self._bar()} {_clock(time.monotonic() - self.t0)} {what}"
        self.stream.write(("\r\x1b[K" if self.tty else "") + line + "\n")
        self.stream.flush()
