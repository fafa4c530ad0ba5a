"""LiveOutput against a real redis-server: readers on the run's replica get exactly what a journal
reader gets (chunks in order, then the end marker), whenever they attach, without reading Redis
per chunk once they are live."""

from __future__ import annotations

import asyncio

import pytest

from chorus.gateway.live_output import LiveOutput
from chorus.gateway.state.connection import open_redis
from chorus.gateway.state.journal import JournalEntry, OutputJournal
from chorus.gateway.state.requests import DONE, FAILED, RUNNING, RequestStore

CHUNKS = [bytes([i]) * (1000 + i) for i in range(40)]
USAGE = {"audio_s": 3.25, "num_segments": 2, "last_sequence": len(CHUNKS) - 1}


@pytest.fixture
async def state(redis_url):
    client = open_redis(redis_url)
    requests = RequestStore(client)
    yield client, requests, OutputJournal(client, requests, block_ms=100)
    await client.aclose()


async def new_run(requests: RequestStore) -> str:
    request_id = (await requests.create("speech", model="m")).request_id
    await requests.transition(request_id, RUNNING)
    return request_id


async def produce(journal: OutputJournal, output: LiveOutput, delay_s: float = 0.005, end: bool = True) -> None:
    """What a run does: journal each chunk, then publish it; the end marker likewise."""
    for sequence, data in enumerate(CHUNKS):
        await journal.append(output.request_id, sequence, data)
        output.publish(JournalEntry(sequence, data))
        await asyncio.sleep(delay_s)
    if end:
        output.publish(await journal.finish(output.request_id, DONE, usage=USAGE))
    output.close()


async def collect(entries) -> list[JournalEntry]:
    return [entry async for entry in entries]


async def num_xreads(client) -> int:
    return (await client.info("commandstats")).get("cmdstat_xread", {}).get("calls", 0)


async def test_a_reader_attached_from_the_start_reads_no_journal(state):
    client, requests, journal = state
    request_id = await new_run(requests)
    output = LiveOutput(journal, request_id)
    xreads_before = await num_xreads(client)
    reader = asyncio.create_task(collect(output.read()))
    await produce(journal, output)
    live = await asyncio.wait_for(reader, timeout=5)
    assert await num_xreads(client) == xreads_before
    assert live == await collect(journal.read(request_id))  # same bytes, order and end marker
    assert live[-1].final == {"status": DONE, "error": None, "usage": USAGE}


@pytest.mark.parametrize("after_sequence", [None, 4, 17])
async def test_a_reader_attached_mid_stream_replays_then_goes_live_without_gaps_or_twins(state, after_sequence):
    _, requests, journal = state
    request_id = await new_run(requests)
    output = LiveOutput(journal, request_id)
    producer = asyncio.create_task(produce(journal, output))
    while output.num_published < 20:
        await asyncio.sleep(0.005)
    late = await asyncio.wait_for(collect(output.read(after_sequence)), timeout=5)
    await producer
    assert late == await collect(journal.read(request_id, after_sequence))
    assert [entry.sequence for entry in late[:-1]] == list(
        range(0 if after_sequence is None else after_sequence + 1, 40)
    )


async def test_a_reader_too_far_behind_catches_up_from_the_journal(state):
    _, requests, journal = state
    request_id = await new_run(requests)
    output = LiveOutput(journal, request_id, max_buffered_bytes=5_000)  # about five chunks
    entries = output.read()
    producer = asyncio.create_task(produce(journal, output, delay_s=0))
    first = await anext(entries)  # subscribed and live; then it stalls while the run goes on
    await producer
    rest = await asyncio.wait_for(collect(entries), timeout=5)
    assert [first, *rest] == await collect(journal.read(request_id))


async def test_a_run_that_ends_without_its_end_marker_leaves_readers_to_the_journal(state):
    _, requests, journal = state
    request_id = await new_run(requests)
    output = LiveOutput(journal, request_id)
    reader = asyncio.create_task(collect(output.read()))
    await requests.transition(request_id, FAILED, error={"code": "UNAVAILABLE", "message": "Redis went away"})
    await produce(journal, output, end=False)  # the end marker's write failed
    live = await asyncio.wait_for(reader, timeout=5)
    # As a journal reader: the chunks, then the end the record holds.
    assert [entry.data for entry in live[:-1]] == CHUNKS
    error = {"code": "UNAVAILABLE", "message": "Redis went away"}
    assert live[-1].final == {"status": FAILED, "error": error, "usage": None}


async def test_a_reader_after_the_run_ended_gets_the_journal(state):
    _, requests, journal = state
    request_id = await new_run(requests)
    output = LiveOutput(journal, request_id)
    await produce(journal, output, delay_s=0)
    assert await collect(output.read()) == await collect(journal.read(request_id))
    assert await collect(output.read(len(CHUNKS) - 1)) == [(await collect(journal.read(request_id)))[-1]]
