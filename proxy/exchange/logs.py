"""Logging set-up: readable text by default, or one JSON object per line (`--log-format json`).

One line per request at a few thousand requests a second must cost microseconds: the handler writes into a buffer
that goes out in batches (when it is large, on a record of WARNING or above, and otherwise within FLUSH_S), instead of
one write and one flush per line; the timestamp text is made once per second.
"""

from __future__ import annotations

import atexit
import io
import json
import logging
import sys
import threading
import time
import weakref
from typing import Any, TextIO

FLUSH_S = 0.2
BUFFER_BYTES = 1 << 16


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and not record.exc_info:
            return self.line(record.name, record.levelname, record.created, fields)
        line = _head(record.name, record.levelname, record.created)
        if isinstance(fields, dict):
            line.update(fields)
        else:
            line["message"] = record.getMessage()
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, separators=(",", ":"))

    @staticmethod
    def line(name: str, levelname: str, created: float, fields: dict[str, Any]) -> str:
        return json.dumps({**_head(name, levelname, created), **fields}, ensure_ascii=False, separators=(",", ":"))


def _head(name: str, levelname: str, created: float) -> dict[str, Any]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return {"ts": f"{stamp}.{_msecs(created):03d}Z", "level": levelname.lower(), "logger": name}


def _msecs(created: float) -> int:
    return int((created - int(created)) * 1000)  # as LogRecord.msecs


class TextFormatter(logging.Formatter):
    """`%(asctime)s %(levelname)s %(name)s: %(message)s`, with the date and time formatted once per second."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._second = -1
        self._stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 (logging's name)
        return self._time(record.created)

    def _time(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._second, self._stamp = second, time.strftime("%Y-%m-%d %H:%M:%S", self.converter(created))
        return f"{self._stamp},{_msecs(created):03d}"

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text or record.stack_info:
            return super().format(record)
        # What logging.Formatter.format makes of the format string above, in one f-string: one per request line.
        record.message = record.getMessage()
        record.asctime = self.formatTime(record)
        return f"{record.asctime} {record.levelname} {record.name}: {record.message}"

    def line(self, name: str, levelname: str, created: float, message: str) -> str:
        return f"{self._time(created)} {levelname} {name}: {message}"


class BatchingHandler(logging.StreamHandler[TextIO]):
    """A stream handler that writes through a buffer and flushes in batches (see the module docstring)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        target = stream if stream is not None else sys.stderr
        try:
            buffered: TextIO = open(target.fileno(), "w", buffering=BUFFER_BYTES, closefd=False)
        except (AttributeError, OSError, io.UnsupportedOperation):  # no descriptor (a test's capture): write through
            buffered = target
        super().__init__(buffered)
        self._direct = buffered is target
        _live.add(self)
        _start_flusher()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(self.format(record) + "\n")
            if self._direct or record.levelno >= logging.WARNING:
                self.stream.flush()
        except Exception:
            self.handleError(record)

    def write(self, text: str) -> bool:
        """One formatted INFO line (see write_line); False when it could not be written."""
        try:
            with self.lock:  # type: ignore[union-attr]  # Handler.createLock made it
                self.stream.write(text + "\n")
                if self._direct:
                    self.stream.flush()
        except Exception:  # the record path reports it (Handler.handleError)
            return False
        return True

    def flush(self) -> None:
        try:
            super().flush()
        except (OSError, ValueError):
            pass  # the stream is gone (the process is ending): nothing more can be written

    def close(self) -> None:
        # Still flushed after this: logging.config.dictConfig (uvicorn configures its loggers with it) closes every
        # handler it finds, and a closed StreamHandler stays attached and keeps writing; only its flushes would stop.
        self.flush()
        super().close()


_live: weakref.WeakSet[BatchingHandler] = weakref.WeakSet()  # every handler still referenced somewhere
_flusher: list[threading.Thread] = []


def _start_flusher() -> None:
    """One thread per process flushes every live handler every FLUSH_S, and once more at exit."""
    if not _flusher:
        _flusher.append(threading.Thread(target=_flush_often, name="log-flush", daemon=True))
        _flusher[0].start()
        atexit.register(_flush_all)


def _flush_often() -> None:
    while True:
        time.sleep(FLUSH_S)
        _flush_all()


def _flush_all() -> None:
    for handler in list(_live):
        handler.flush()


def write_line(logger: logging.Logger, line: str, fields: dict[str, object]) -> None:
    """`logger.info(line, extra={"fields": fields})`, at INFO (the caller checks isEnabledFor). Where the one handler
    the record would reach is this module's, set up by configure_logging (the usual case), the line is formatted as
    its formatter would and written straight into its buffer: a LogRecord, the caller's frame and the handler chain
    cost ~40 us, as much as a small request's counting. Any other set-up (a test's capture, an embedding
    application's handlers) gets the record itself."""
    handler = _sole_batching_handler(logger)
    if handler is not None:
        formatter, created = handler.formatter, time.time()
        if isinstance(formatter, JsonFormatter):
            text = formatter.line(logger.name, "INFO", created, fields)
        else:
            assert isinstance(formatter, TextFormatter)
            text = formatter.line(logger.name, "INFO", created, line)
        if handler.write(text):
            return
    logger.handle(logger.makeRecord(logger.name, logging.INFO, __file__, 0, line, (), None, extra={"fields": fields}))


def _sole_batching_handler(logger: logging.Logger) -> BatchingHandler | None:
    """The handler an INFO record of `logger` would reach, when it is the only one, ours, unfiltered and formats with
    one of this module's formatters; else None."""
    if logger.filters:
        return None
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        found += current.handlers
        current = current.parent if current.propagate else None
    if len(found) != 1:
        return None
    handler = found[0]
    if (type(handler) is not BatchingHandler or handler.filters or handler.level > logging.INFO
            or type(handler.formatter) not in (TextFormatter, JsonFormatter)):  # fmt: skip
        return None
    return handler


def configure_logging(level: str, fmt: str) -> None:
    handler = BatchingHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in root.handlers:
        if isinstance(old, BatchingHandler):
            old.close()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
