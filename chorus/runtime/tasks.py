"""Stopping background tasks: cancel, wait, and cancel again a task that lost its cancel.

On Python 3.11 a cancel can be lost: `asyncio.wait_for` returns the inner call's result when the cancel lands
as that call completes (cpython gh-86296, fixed in 3.12), and redis-py sends every command through `wait_for`.
A task looping over Redis commands (the gateway's run broker, its cancel listener) then runs on, still marked
`cancelling()`, and a close that awaited it never returned: CI teardowns hung until pytest's 300 s timeout. A
cancel still pending after `recancel_after_s` is taken as lost and sent again; cancelling at once a task that
is already cancelling would instead cut the cleanup its first cancel started.

A task whose hot loop awaits Redis (the speech pipeline's talker side journals every chunk of frames) calls
`raise_if_cancel_lost` after each command instead: it stops at once rather than a re-cancel later, while its
stream keeps the backends busy.

A loop the process cannot serve without (a gateway's run leases, its backends' health, its cancel listener; the
vocoder's engine task; the talker's and the diffusion engine's threads) is watched by `exit_if_it_fails` (a task)
or `exit_if_it_raises` (a thread's target): should it end with an error, the process exits rather than serve on
without it while its health says SERVING.

A task stopping one of its own (`cancel_and_join`) must not swallow a cancel of itself: `task.cancel()` then
`await task` under `suppress(CancelledError)` does, since a cancel of a task awaiting another is passed on to
the one awaited, whose CancelledError is then all the caller sees. `asyncio.wait` is cancelled instead.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
from collections.abc import Callable, Iterable

log = logging.getLogger("chorus.tasks")


async def cancel_and_wait(
    tasks: Iterable[asyncio.Task], what: str, recancel_after_s: float = 1.0, timeout_s: float = 10.0
) -> bool:
    """Cancels `tasks` (those not cancelling already) and waits until they end, cancelling again every
    `recancel_after_s` those still running. After `timeout_s` gives up, logging the stacks of those left, and
    returns False: a close must return even if a task never does."""
    pending = {task for task in tasks if not task.done()}
    for task in pending:
        if not task.cancelling():
            task.cancel()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while pending:
        time_left_s = deadline - loop.time()
        if time_left_s <= 0:
            log.error("%s: %d task(s) still running %.0f s after cancel:\n%s", what, len(pending), timeout_s,
                      "".join(_stack(task) for task in pending))  # fmt: skip
            return False
        _, pending = await asyncio.wait(pending, timeout=min(recancel_after_s, time_left_s))
        for task in pending:
            log.warning("%s: %s still running after its cancel: cancelling it again", what, task.get_name())
            task.cancel()
    return True


async def cancel_and_join(task: asyncio.Task, what: str) -> None:
    """Cancels `task` and waits until it ends (as `cancel_and_wait`), then raises what it raised, if anything other
    than its cancel. A cancel of the caller meanwhile propagates."""
    await cancel_and_wait([task], what)
    if task.done() and not task.cancelled() and task.exception() is not None:
        raise task.exception()


async def cancel_and_drop(task: asyncio.Task, what: str) -> None:
    """Cancels `task` and waits until it ends (as `cancel_and_wait`), dropping what it raised: for a helper whose
    caller raises what ended their shared work. Its error is read, so asyncio does not log it as never retrieved."""
    await cancel_and_wait([task], what)
    if task.done() and not task.cancelled():
        task.exception()


def exit_if_it_fails(task: asyncio.Task, what: str) -> asyncio.Task:
    """Ends the process with exit code 1, after logging why, if `task` ends with an error (not a cancel): a gateway
    whose lease keeper died served on while other processes took its runs over, one whose health watch died routed by
    a frozen view of its backends, a vocoder whose engine task died refused every stream. Exiting is the failure
    the rest is built for: other gateway processes reclaim its runs once their leases lapse, and the supervisor
    (`chorus up`) or Kubernetes starts it again. Returns `task`."""

    def on_done(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            _exit(what, task.exception())

    task.add_done_callback(on_done)
    return task


def exit_if_it_raises(target: Callable[[], None], what: str) -> Callable[[], None]:
    """`target`, for a thread the process cannot serve without, ending the process as `exit_if_it_fails` does if it
    raises: an engine thread that died left its requests waiting for output that never came."""

    def run() -> None:
        try:
            target()
        except BaseException as error:
            _exit(what, error)

    return run


def _exit(what: str, error: BaseException) -> None:
    log.critical("%s failed; exiting so that the process is restarted", what, exc_info=error)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(1)


def raise_if_cancel_lost() -> None:
    """After an await that can lose a cancel on Python 3.11 (a redis-py command): raise the cancel the calling task
    was sent and did not get. Only where that task never goes on by choice after a cancel (not in a cleanup that
    caught one)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _stack(task: asyncio.Task) -> str:
    text = io.StringIO()
    task.print_stack(file=text)
    return text.getvalue()
