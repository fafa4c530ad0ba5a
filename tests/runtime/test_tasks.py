"""Stopping background tasks: a cancel that Python 3.11's `asyncio.wait_for` drops is sent again, and a close
gives up (saying where the task is stuck) rather than wait forever; a task stopping one of its own raises what
that one raised and never swallows a cancel of itself; a vital loop that fails ends its process."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import subprocess
import sys

import pytest

from chorus.runtime.tasks import cancel_and_drop, cancel_and_join, cancel_and_wait, raise_if_cancel_lost


async def test_a_cancel_that_wait_for_dropped_is_sent_again():
    replies: list[asyncio.Future] = []
    waiting = asyncio.Event()

    async def poll():  # a loop of Redis commands: redis-py sends each through asyncio.wait_for
        while True:
            replies.append(asyncio.get_running_loop().create_future())
            waiting.set()
            await asyncio.wait_for(replies[-1], timeout=10)
            await asyncio.sleep(0.01)

    task = asyncio.create_task(poll())
    await waiting.wait()
    replies[-1].set_result(None)  # the reply and the cancel land in the same loop iteration
    task.cancel()
    await asyncio.sleep(0.05)
    if sys.version_info < (3, 12):  # gh-86296: wait_for returned the reply, the cancel is gone and the loop runs on
        assert not task.done() and task.cancelling() == 1 and len(replies) > 1
    async with asyncio.timeout(5):
        assert await cancel_and_wait([task], "poller", recancel_after_s=0.05)
    assert task.cancelled()


async def test_a_loop_that_checks_after_each_command_stops_on_a_cancel_wait_for_dropped():
    replies: list[asyncio.Future] = []
    waiting = asyncio.Event()

    async def journal_frames():  # the speech pipeline's talker side: a Redis command for every chunk
        while True:
            replies.append(asyncio.get_running_loop().create_future())
            waiting.set()
            await asyncio.wait_for(replies[-1], timeout=10)
            raise_if_cancel_lost()
            await asyncio.sleep(0.01)

    task = asyncio.create_task(journal_frames())
    await waiting.wait()
    replies[-1].set_result(None)  # the reply and the cancel land in the same loop iteration
    task.cancel()
    async with asyncio.timeout(5):
        await asyncio.wait({task})
    assert task.cancelled() and len(replies) == 1  # stopped after that command, no re-cancel needed


async def test_a_task_already_cancelling_finishes_its_cleanup():
    cleaned_up = asyncio.Event()

    async def run():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.1)  # e.g. recording that the run was cancelled
            cleaned_up.set()
            raise

    task = asyncio.create_task(run())
    await asyncio.sleep(0)
    task.cancel()  # as a hand-over does before waiting for the run
    assert await cancel_and_wait([task], "run", recancel_after_s=1.0)
    assert cleaned_up.is_set() and task.cancelled()


async def test_gives_up_after_the_timeout_and_logs_where_the_task_is(caplog):
    release = asyncio.Event()

    async def stubborn():
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.01)

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="chorus.tasks"):
        assert not await cancel_and_wait([task], "stubborn loop", recancel_after_s=0.05, timeout_s=0.2)
    assert "stubborn loop: 1 task(s) still running" in caplog.text and "in stubborn" in caplog.text
    release.set()
    await task


async def test_join_raises_what_the_task_raised_but_not_its_cancel():
    async def failing_cleanup():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ValueError("its cleanup failed") from None

    for body, error in ((asyncio.Event().wait, None), (failing_cleanup, ValueError)):
        task = asyncio.create_task(body())
        await asyncio.sleep(0)
        if error is None:
            await cancel_and_join(task, "task")
            assert task.cancelled()
        else:
            with pytest.raises(error):
                await cancel_and_join(task, "task")


async def test_join_never_swallows_a_cancel_of_the_caller():
    caller: asyncio.Task | None = None

    async def child():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            caller.cancel()  # lands while the caller waits for this task to end
            raise

    async def stop_child() -> str:
        task = asyncio.create_task(child())
        await asyncio.sleep(0)
        await cancel_and_join(task, "child")
        return "went on"

    caller = asyncio.create_task(stop_child())
    async with asyncio.timeout(5):
        await asyncio.wait([caller])
    # `task.cancel(); await task` under suppress(CancelledError) returns "went on": on 3.11 the caller's cancel is
    # passed on to the child it awaits, and the child's CancelledError looks like the expected one.
    assert caller.cancelled()


async def test_drop_reads_a_failed_helpers_error_so_asyncio_logs_nothing():
    reported: list[dict] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:

        async def refused():  # a text writer whose talker refused the connection
            raise ConnectionRefusedError("talker gone")

        for stop in (cancel_and_drop, lambda task, what: cancel_and_wait([task], what)):
            task = asyncio.create_task(refused())
            await asyncio.sleep(0)
            await stop(task, "writer")
            del task
            gc.collect()  # a task whose error nobody read reports it to the loop when it is collected
        assert len(reported) == 1 and "never retrieved" in reported[0]["message"], reported  # cancel_and_wait's
    finally:
        loop.set_exception_handler(None)


_LOOP_SCRIPT = """
import asyncio, logging, sys, threading, time
from chorus.runtime.tasks import exit_if_it_fails, exit_if_it_raises

def bug():
    raise RuntimeError("a bug in the loop")

async def loop(how):
    await asyncio.sleep(0.05)
    if how == "task fails":
        bug()
    await asyncio.sleep(60)

async def main(how):
    task = exit_if_it_fails(asyncio.create_task(loop(how)), "the test loop")
    if how == "thread raises":
        threading.Thread(target=exit_if_it_raises(bug, "the test thread"), daemon=True).start()
    if how == "task cancelled":
        await asyncio.sleep(0.1)
        task.cancel()
    await asyncio.sleep(1.0)
    print("served on")

logging.basicConfig()
asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize(
    ("how", "what"), [("task fails", "the test loop"), ("thread raises", "the test thread"), ("task cancelled", None)]
)
def test_a_vital_loop_that_fails_ends_its_process_with_the_reason(how, what):
    """A real process: a watched task or thread that raises ends it with exit code 1 and a log line naming the loop
    and the error, before it could serve on without the loop; a task that is cancelled (a stop) ends nothing."""
    run = subprocess.run([sys.executable, "-c", _LOOP_SCRIPT, how], capture_output=True, text=True, timeout=60)
    if what is not None:
        assert run.returncode == 1 and "served on" not in run.stdout
        assert f"{what} failed; exiting" in run.stderr and "RuntimeError: a bug in the loop" in run.stderr
    else:
        assert run.returncode == 0 and "served on" in run.stdout and "failed" not in run.stderr
