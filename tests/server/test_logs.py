"""The log handler: request lines go out in batches, but never later than a flush interval, and a warning at once."""

from __future__ import annotations

import logging
import os
import select

from proxy.server.logs import FLUSH_S, BatchingHandler, TextFormatter
from tests.support.polling import eventually


def readable(fd: int) -> bytes:
    if select.select([fd], [], [], 0)[0]:
        return os.read(fd, 65536)
    return b""


def test_info_lines_are_batched_and_still_arrive_and_warnings_go_out_at_once() -> None:
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as stream:
        handler = BatchingHandler(stream)
        handler.setFormatter(TextFormatter())
        logger = logging.getLogger("test.batching")
        logger.propagate, logger.handlers = False, [handler]
        logger.setLevel(logging.INFO)
        try:
            logger.info("request line %d", 1)
            assert readable(read_end) == b""  # buffered, not yet written
            seen = bytearray()

            def arrived() -> bool:
                seen.extend(readable(read_end))
                return b"request line 1" in seen

            assert eventually(arrived, timeout_s=FLUSH_S * 10)
            logger.warning("something is off")
            assert b"WARNING test.batching: something is off" in readable(read_end)
        finally:
            handler.close()
            os.close(read_end)


def test_the_text_format_names_time_level_and_logger() -> None:
    record = logging.LogRecord("token_guard.requests", logging.INFO, __file__, 1, "x=%d", (1,), None)
    line = TextFormatter().format(record)
    date, clock, level, name, message = line.split(" ")
    assert len(date) == 10 and clock.count(":") == 2 and "," in clock
    assert (level, name, message) == ("INFO", "token_guard.requests:", "x=1")


def test_lines_still_arrive_after_the_handler_was_closed_by_a_logging_reconfiguration() -> None:
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as stream:
        handler = BatchingHandler(stream)
        logger = logging.getLogger("test.reconfigured")
        logger.propagate, logger.handlers = False, [handler]
        logger.setLevel(logging.INFO)
        try:
            handler.close()  # what logging.config.dictConfig does to every handler, as uvicorn starts
            logger.info("after the reconfiguration")
            seen = bytearray()

            def arrived() -> bool:
                seen.extend(readable(read_end))
                return b"after the reconfiguration" in seen

            assert eventually(arrived, timeout_s=FLUSH_S * 10)
        finally:
            os.close(read_end)
