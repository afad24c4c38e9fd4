"""A text stream that wraps another and passes on what it does not change: the command
line's console streams (a reader that may leave, Ray's echo dropped) and a trial's output
copied to its ``output.log`` are built on it."""

from __future__ import annotations

import io


class PassThroughStream(io.TextIOBase):
    """Wraps ``stream``: flushing, the terminal check, the descriptor and the encoding are
    the wrapped stream's; subclasses change what writing does."""

    def __init__(self, stream) -> None:
        super().__init__()
        self.stream = stream

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", "utf-8")
