"""The log handler: request lines go out in batches, but never later than a flush interval, and a warning at once."""

from __future__ import annotations

import json
import logging
import os
import select
from typing import TextIO

from proxy.server.logs import FLUSH_S, BatchingHandler, JsonFormatter, TextFormatter, write_line
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


def _pipe_logger(name: str, formatter: logging.Formatter) -> tuple[logging.Logger, BatchingHandler, int, TextIO]:
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    handler = BatchingHandler(stream)
    handler.setFormatter(formatter)
    parent = logging.getLogger(name)  # the handler sits on the parent, as configure_logging puts it on the root
    parent.propagate, parent.handlers = False, [handler]
    parent.setLevel(logging.INFO)
    return logging.getLogger(name + ".requests"), handler, read_end, stream


def _read_line(handler: BatchingHandler, read_end: int) -> str:
    handler.flush()
    return readable(read_end).decode()


FIELDS = {"request_id": "abc", "status": 200, "prompt_tokens": 12, "total_s": 0.0123}


def test_a_request_line_written_directly_reads_as_the_formatter_writes_the_record() -> None:
    logger, handler, read_end, stream = _pipe_logger("test.direct_text", TextFormatter())
    try:
        write_line(logger, "request_id=abc status=200", FIELDS)
        direct = _read_line(handler, read_end)
        logger.info("%s", "request_id=abc status=200", extra={"fields": FIELDS})
        recorded = _read_line(handler, read_end)
        assert direct.endswith(" INFO test.direct_text.requests: request_id=abc status=200\n")
        assert direct.split(" ", 2)[2] == recorded.split(" ", 2)[2]  # all but the date and time
        assert len(direct.split(" ", 2)[1]) == len(recorded.split(" ", 2)[1]) == len("12:00:00,000")
    finally:
        handler.close()
        os.close(read_end)
        stream.close()


def test_a_json_request_line_holds_the_fields_after_time_level_and_logger() -> None:
    logger, handler, read_end, stream = _pipe_logger("test.direct_json", JsonFormatter())
    try:
        write_line(logger, "ignored in JSON", FIELDS)
        direct = json.loads(_read_line(handler, read_end))
        logger.info("%s", "ignored in JSON", extra={"fields": FIELDS})
        recorded = json.loads(_read_line(handler, read_end))
        assert list(direct) == ["ts", "level", "logger", *FIELDS]
        assert {k: v for k, v in direct.items() if k != "ts"} == {k: v for k, v in recorded.items() if k != "ts"}
        assert direct["level"] == "info" and direct["logger"] == "test.direct_json.requests"
        assert direct["ts"].endswith("Z") and len(direct["ts"]) == len(recorded["ts"])
    finally:
        handler.close()
        os.close(read_end)
        stream.close()


def test_any_other_handler_on_the_way_gets_a_record_with_the_fields() -> None:
    logger, handler, read_end, stream = _pipe_logger("test.direct_other", TextFormatter())
    seen: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logger.addHandler(Collect())
    try:
        write_line(logger, "request_id=abc", FIELDS)
        assert [(r.getMessage(), getattr(r, "fields", None)) for r in seen] == [("request_id=abc", FIELDS)]
        assert _read_line(handler, read_end).endswith("INFO test.direct_other.requests: request_id=abc\n")
    finally:
        logger.handlers = []
        handler.close()
        os.close(read_end)
        stream.close()
