"""Running segments concurrently (bounded) while emitting their output strictly in order.

Segment 0's chunks pass through as soon as they are made (first audio is not delayed by later
segments); later segments run ahead into bounded per-segment buffers and pause when theirs is
full, so memory stays bounded however far ahead they get. When the consumer stops early
(client gone, cancel) every running segment is cancelled before this generator returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

Item = TypeVar("Item")
Chunk = TypeVar("Chunk")

_END = object()


async def ordered_concurrent(
    items: Sequence[Item],
    run: Callable[[Item], AsyncIterator[Chunk]],
    max_concurrency: int,
    max_buffered_chunks: int = 8,
) -> AsyncIterator[Chunk]:
    """Chunks of `run(items[0])`, then of `run(items[1])`, …, with up to `max_concurrency` running at once."""
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency: must be at least 1, got {max_concurrency}")
    slots = asyncio.Semaphore(max_concurrency)
    queues: list[asyncio.Queue] = [asyncio.Queue(maxsize=max_buffered_chunks) for _ in items]

    async def produce(index: int) -> None:
        # Segments start in order: a later one never takes the slot an earlier one is waiting for.
        async with slots:
            try:
                async for chunk in run(items[index]):
                    await queues[index].put(chunk)
            except Exception as exc:  # handed to the consumer, which raises it in order
                await queues[index].put(exc)
                return
            await queues[index].put(_END)

    tasks: list[asyncio.Task] = []
    try:
        for index in range(len(items)):
            tasks.append(asyncio.create_task(produce(index), name=f"segment-{index}"))
        for queue in queues:
            while (chunk := await queue.get()) is not _END:
                if isinstance(chunk, Exception):
                    raise chunk
                yield chunk
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
