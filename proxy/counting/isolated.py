"""Work that runs in a child process, so that the event loop only waits on a future:

- chat templates that come with a request (trusted only by `policy.trust_request_chat_template`), with a time and a
  memory limit: a template can loop for minutes or build gigabytes of text, and no hook inside Jinja bounds every
  loop. A template over its time is answered with a 400 and its process killed, so the work stops too;
- the parse of the largest request bodies, and of those with many values: json.loads holds the interpreter lock
  for the whole parse (about 90 ms for 31 MB of text; a body of many small arrays costs far more per byte), and the
  guard would answer nothing meanwhile, not even /livez. The parsed object comes back packed, and is unpacked here
  with the garbage collector paused: that copies the text without scanning it, and builds the values
  (server.max_json_values of them at most, counted in the child before anything is built) faster than parsing them.

Each kind has one long-lived child, spawned on first use; calls queue for it (both are rare, and each is bounded, so
a queue is cheaper than a pool of processes). The core a front end serves with creates one of each and closes them
when its lifetime ends (exchange/core.py); nothing here is global to the process. An idle child ignores SIGTERM and
SIGINT: its owner ends it when the guard stops. Killed by a signal to the whole process group, an idle child died
holding its pool's queue lock, and the pool's terminate, at exit, then waited for that lock for ever: the guard never
exited. At work it holds no lock, and SIGTERM ends it (the pool's terminate sends it, past a call's time limit).
"""

from __future__ import annotations

import asyncio
import marshal
import multiprocessing
import multiprocessing.pool
import resource
import signal
from collections.abc import Callable
from typing import Any, TypeVar

from proxy.api.body import MAX_VALUES, check_encoding, parse_json_object, without_gc
from proxy.api.shape import values_bound
from proxy.counting.templates import RenderArgs, TemplateError, render
from proxy.errors import InvalidRequest

T = TypeVar("T")

TIME_LIMIT_S = 2.0  # the longest a request's template may render
MEMORY_LIMIT_MB = 1024  # the template child's address space
LARGE_BODY_BYTES = 4 * 2**20  # bodies from this size are parsed in the child: ~10 ms of parse and more
LOOP_VALUES = 2**14  # and bodies with more `[`, `{` and `,` than this: values cost 0.1-0.4 us each to build
PARSE_TIME_LIMIT_S = 30.0  # far above what the largest body takes (~0.1 s), queue included
PARSE_MEMORY_LIMIT_MB = 2048  # a 31 MB text is held up to four times at once (raw, decoded, parsed, packed)


class ChildProcess:
    """One spawned worker process with an address-space limit; `call` runs a function in it within a time limit."""

    def __init__(self, memory_limit_mb: int) -> None:
        self.memory_limit_mb = memory_limit_mb
        self._pool: multiprocessing.pool.Pool | None = None
        self._turn: asyncio.Lock | None = None

    async def call(self, fn: Callable[..., T], args: tuple[Any, ...], time_limit_s: float, stop_on_cancel: bool) -> T:
        """fn(*args) in the child; TimeoutError (and the child killed) past `time_limit_s`. A call whose caller is
        cancelled kills the child when `stop_on_cancel` (the work may be endless), else runs to its end unheard."""
        if self._turn is None:
            self._turn = asyncio.Lock()
        async with self._turn:
            pool = self._pool if self._pool is not None else await asyncio.to_thread(self._start)
            loop = asyncio.get_running_loop()
            done: asyncio.Future[T] = loop.create_future()

            def finished(result: T) -> None:
                loop.call_soon_threadsafe(_resolve, done, result, None)

            def failed(error: BaseException) -> None:
                loop.call_soon_threadsafe(_resolve, done, None, error)

            pool.apply_async(_work, (fn, args), callback=finished, error_callback=failed)
            try:
                return await asyncio.wait_for(asyncio.shield(done), time_limit_s)
            except TimeoutError:
                await self._kill()
                raise
            except asyncio.CancelledError:
                if stop_on_cancel and not done.done():  # the next call must not wait behind it
                    await asyncio.shield(self._kill())
                elif not done.done():  # bounded work: let it end before the next call starts
                    await asyncio.shield(asyncio.wait([done], timeout=time_limit_s))
                raise

    def _start(self) -> multiprocessing.pool.Pool:
        context = multiprocessing.get_context("spawn")  # not a fork of a process holding tokenizers and sockets
        pool = context.Pool(1, initializer=_child_setup, initargs=(self.memory_limit_mb,))
        pool.apply(_ready)  # started and its imports done: the time limit is the work's alone
        self._pool = pool
        return pool

    async def _kill(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.terminate)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None


class IsolatedRenderer:
    def __init__(self, time_limit_s: float = TIME_LIMIT_S, memory_limit_mb: int = MEMORY_LIMIT_MB) -> None:
        self.time_limit_s = time_limit_s
        self.child = ChildProcess(memory_limit_mb)

    async def render(self, args: RenderArgs) -> str:
        """As templates.render(*args), always in the sandbox; TemplateError when it fails or runs out of time or
        memory."""
        source, _, conversation, tools, generation_prompt, continue_final, variables = args
        sandboxed = (source, False, conversation, tools, generation_prompt, continue_final, dict(variables))
        try:
            return await self.child.call(render, sandboxed, self.time_limit_s, stop_on_cancel=True)
        except TimeoutError:
            raise TemplateError(f"the request's chat template took longer than {self.time_limit_s:g} s to "
                                "render") from None  # fmt: skip

    def close(self) -> None:
        self.child.close()


class BodyParser:
    def __init__(self, time_limit_s: float = PARSE_TIME_LIMIT_S, memory_limit_mb: int = PARSE_MEMORY_LIMIT_MB) -> None:
        self.time_limit_s = time_limit_s
        self.child = ChildProcess(memory_limit_mb)

    async def parse(self, raw: bytes, max_depth: int, max_values: int = MAX_VALUES) -> dict[str, Any]:
        """As api/body.parse_json_object: small bodies of few values here, the others in the child. A body that is not
        UTF-8 is refused before it is scanned (parse_json_object checks it first) or sent to the child."""
        if len(raw) <= LOOP_VALUES or (len(raw) < LARGE_BODY_BYTES and values_bound(raw) <= LOOP_VALUES):
            return parse_json_object(raw, max_depth, max_values)
        check_encoding(raw)
        try:
            packed = await self.child.call(_parse_packed, (raw, max_depth, max_values), self.time_limit_s,
                                           stop_on_cancel=False)  # fmt: skip
        except TimeoutError:
            raise InvalidRequest(f"The request body could not be read within {self.time_limit_s:g} s.") from None
        except MemoryError:
            raise InvalidRequest(f"The request body takes more than {self.child.memory_limit_mb} MB to "
                                 "read.") from None  # fmt: skip
        body: dict[str, Any] = without_gc(marshal.loads, packed)
        await asyncio.sleep(0)  # what the guard does with the values next starts in a loop turn of its own
        return body

    def close(self) -> None:
        self.child.close()


def _resolve(done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)


def _parse_packed(raw: bytes, max_depth: int, max_values: int) -> bytes:
    """In the child: the parsed body, packed here so that the guard unpacks it itself, with the collector paused
    (multiprocessing would unpickle it in a thread of its own, with the collector running). marshal carries exactly
    the JSON types, between two processes of the same interpreter, and reads them back 10-50% faster than pickle."""
    return marshal.dumps(parse_json_object(raw, max_depth, max_values))


def _ready() -> bool:
    return True


def _child_setup(megabytes: int) -> None:
    """In the child, first: its memory limit, and the signals a stop sends the whole process group ignored while it
    waits for work (the guard ends its children itself, once its own requests are done with them)."""
    limit = megabytes * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _work(fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """In the child: fn(*args), with SIGTERM ending it meanwhile (the pool's terminate, a call past its time limit)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        return fn(*args)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
