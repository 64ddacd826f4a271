"""The log handler: request lines go out in batches, but never later than a flush interval, and a warning at once."""

from __future__ import annotations

import json
import logging
import os
import select

from proxy.exchange.logs import FLUSH_S, BatchingHandler, JsonFormatter, TextFormatter, write_line
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


class PipeLog:
    """A logger whose INFO records reach one BatchingHandler on its parent (as configure_logging puts one on the
    root), writing into a pipe this test reads."""

    def __init__(self, name: str, formatter: logging.Formatter) -> None:
        self.read_end, write_end = os.pipe()
        self.stream = os.fdopen(write_end, "w")
        self.handler = BatchingHandler(self.stream)
        self.handler.setFormatter(formatter)
        parent = logging.getLogger(name)
        parent.propagate, parent.handlers = False, [self.handler]
        parent.setLevel(logging.INFO)
        self.logger = logging.getLogger(name + ".requests")

    def read(self) -> str:
        self.handler.flush()
        return readable(self.read_end).decode()

    def __enter__(self) -> PipeLog:
        return self

    def __exit__(self, *_: object) -> None:
        self.logger.handlers = []
        self.handler.close()
        os.close(self.read_end)
        self.stream.close()


FIELDS = {"request_id": "abc", "status": 200, "prompt_tokens": 12, "total_s": 0.0123}


def test_a_request_line_written_directly_reads_as_the_formatter_writes_the_record() -> None:
    with PipeLog("test.direct_text", TextFormatter()) as log:
        write_line(log.logger, "request_id=abc status=200", FIELDS)
        direct = log.read()
        log.logger.info("%s", "request_id=abc status=200", extra={"fields": FIELDS})
        recorded = log.read()
    assert direct.endswith(" INFO test.direct_text.requests: request_id=abc status=200\n")
    assert direct.split(" ", 2)[2] == recorded.split(" ", 2)[2]  # all but the date and time
    assert len(direct.split(" ", 2)[1]) == len(recorded.split(" ", 2)[1]) == len("12:00:00,000")


def test_a_json_request_line_holds_the_fields_after_time_level_and_logger() -> None:
    with PipeLog("test.direct_json", JsonFormatter()) as log:
        write_line(log.logger, "ignored in JSON", FIELDS)
        direct = json.loads(log.read())
        log.logger.info("%s", "ignored in JSON", extra={"fields": FIELDS})
        recorded = json.loads(log.read())
    assert list(direct) == ["ts", "level", "logger", *FIELDS]
    assert {k: v for k, v in direct.items() if k != "ts"} == {k: v for k, v in recorded.items() if k != "ts"}
    assert direct["level"] == "info" and direct["logger"] == "test.direct_json.requests"
    assert direct["ts"].endswith("Z") and len(direct["ts"]) == len(recorded["ts"])


def test_any_other_handler_on_the_way_gets_a_record_with_the_fields() -> None:
    seen: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    with PipeLog("test.direct_other", TextFormatter()) as log:
        log.logger.addHandler(Collect())
        write_line(log.logger, "request_id=abc", FIELDS)
        line = log.read()
    assert [(r.getMessage(), getattr(r, "fields", None)) for r in seen] == [("request_id=abc", FIELDS)]
    assert line.endswith("INFO test.direct_other.requests: request_id=abc\n")
