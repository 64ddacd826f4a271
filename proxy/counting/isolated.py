"""Chat templates that come with a request (trusted only by `policy.trust_request_chat_template`) rendered in a child
process, with a time and a memory limit: a template can loop for minutes or build gigabytes of text, and no hook
inside Jinja bounds every loop. The event loop only waits on a future; a template over its time is answered with a
400 and its process killed, so the work stops too. One render at a time: request templates are rare and each is
bounded, so a queue is cheaper than a pool of processes.
"""

from __future__ import annotations

import asyncio
import atexit
import multiprocessing
import multiprocessing.pool
import resource

from proxy.counting.templates import RenderArgs, TemplateError, render

TIME_LIMIT_S = 2.0  # the longest a request's template may render
MEMORY_LIMIT_MB = 1024  # the child process's address space


class IsolatedRenderer:
    def __init__(self, time_limit_s: float = TIME_LIMIT_S, memory_limit_mb: int = MEMORY_LIMIT_MB) -> None:
        self.time_limit_s, self.memory_limit_mb = time_limit_s, memory_limit_mb
        self._pool: multiprocessing.pool.Pool | None = None
        self._turn: asyncio.Lock | None = None
        self._closing_registered = False

    async def render(self, args: RenderArgs) -> str:
        """As templates.render(*args), always in the sandbox; TemplateError when it fails or runs out of time or
        memory."""
        if self._turn is None:
            self._turn = asyncio.Lock()
        async with self._turn:
            pool = self._pool if self._pool is not None else await asyncio.to_thread(self._start)
            loop = asyncio.get_running_loop()
            done: asyncio.Future[str] = loop.create_future()

            def finished(text: str) -> None:
                loop.call_soon_threadsafe(_settle, done, text, None)

            def failed(error: BaseException) -> None:
                loop.call_soon_threadsafe(_settle, done, None, error)

            source, _, conversation, tools, generation_prompt, continue_final, variables = args
            sandboxed = (source, False, conversation, tools, generation_prompt, continue_final, dict(variables))
            pool.apply_async(render, sandboxed, callback=finished, error_callback=failed)
            try:
                return await asyncio.wait_for(asyncio.shield(done), self.time_limit_s)
            except TimeoutError:
                await self._kill()
                raise TemplateError(f"the request's chat template took longer than {self.time_limit_s:g} s to "
                                    "render") from None  # fmt: skip
            except asyncio.CancelledError:  # the client left: its render must not hold the next one's turn
                if not done.done():
                    await asyncio.shield(self._kill())
                raise

    def _start(self) -> multiprocessing.pool.Pool:
        context = multiprocessing.get_context("spawn")  # not a fork of a process holding tokenizers and sockets
        pool = context.Pool(1, initializer=_limit_memory, initargs=(self.memory_limit_mb,))
        pool.apply(_ready)  # started and its imports done: the time limit is the template's alone
        if self._pool is None and not self._closing_registered:
            atexit.register(self.close)  # before the interpreter tears down what Pool.__del__ needs
            self._closing_registered = True
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


def _settle(done: asyncio.Future[str], text: str | None, error: BaseException | None) -> None:
    if done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(text or "")


def _ready() -> bool:
    return True


def _limit_memory(megabytes: int) -> None:
    limit = megabytes * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


RENDERER = IsolatedRenderer()
"""The process's one renderer of request templates (its child process starts on first use)."""
