"""Request state against a real redis-server: records, journal, cancel, idempotency, keys, limits."""

from __future__ import annotations

import asyncio
import time

import pytest

from chorus.gateway.errors import Unauthorized
from chorus.gateway.state import keys
from chorus.gateway.state.auth import ApiKeys, RateLimiter, hash_key
from chorus.gateway.state.cancel import CancelListener
from chorus.gateway.state.connection import open_redis
from chorus.gateway.state.journal import JournalTrimmed, OutputJournal
from chorus.gateway.state.requests import CANCELLED, DONE, FAILED, QUEUED, RUNNING, RequestStore
from chorus.gateway.state.runs import RunQueue
from chorus.runtime.errors import NotFound, Overloaded, Unavailable
from chorus.runtime.processes import free_port


@pytest.fixture
async def client(redis_url):
    client = open_redis(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def other_client(redis_url):
    """A second connection pool: what another gateway replica would hold."""
    client = open_redis(redis_url)
    yield client
    await client.aclose()


async def test_record_round_trip_with_ttl(client):
    store = RequestStore(client, ttl_s=600)
    created = await store.create("speech", model="qwen3-tts", voice="vivian", owner="k1")
    record = await store.get(created.request_id)
    assert record == created
    assert record.status == QUEUED
    assert 0 < await client.ttl(keys.record(created.request_id)) <= 600
    with pytest.raises(NotFound):
        await store.get("no-such-request")


async def test_transitions_follow_the_state_machine(client):
    store = RequestStore(client)
    request_id = (await store.create("speech", model="m")).request_id
    assert not await store.transition(request_id, DONE)  # queued cannot finish without running
    assert await store.transition(request_id, RUNNING)
    assert not await store.transition(request_id, RUNNING)
    usage = {"audio_s": 1.5, "num_frames": 18}
    assert await store.transition(request_id, DONE, usage=usage, last_sequence=7)
    assert not await store.transition(request_id, FAILED)
    record = await store.get(request_id)
    assert (record.status, record.usage, record.last_sequence) == (DONE, usage, 7)
    assert record.created_at_s <= record.started_at_s <= record.finished_at_s
    with pytest.raises(NotFound):
        await store.transition("no-such-request", RUNNING)


async def test_only_one_replica_wins_a_race(client, other_client):
    stores = [RequestStore(client), RequestStore(other_client)]
    request_id = (await stores[0].create("audio", model="m")).request_id
    outcomes = await asyncio.gather(*(stores[i % 2].transition(request_id, RUNNING) for i in range(20)))
    assert outcomes.count(True) == 1
    outcomes = await asyncio.gather(stores[0].transition(request_id, DONE), stores[1].transition(request_id, CANCELLED))
    assert outcomes.count(True) == 1


async def test_journal_replays_after_a_sequence_then_follows_live(client):
    store = RequestStore(client)
    journal = OutputJournal(client, store, block_ms=100)
    request_id = (await store.create("speech", model="m")).request_id
    chunks = [bytes([i]) * (100 + i) for i in range(6)]

    async def read_all(after_sequence):
        return [entry async for entry in journal.read(request_id, after_sequence)]

    live_reader = asyncio.create_task(read_all(None))
    for sequence, chunk in enumerate(chunks[:3]):
        await journal.append(request_id, sequence, chunk)
    resumed_reader = asyncio.create_task(read_all(1))  # the client got 0 and 1, then lost the stream
    await asyncio.sleep(0.2)
    for sequence, chunk in enumerate(chunks[3:], start=3):
        await journal.append(request_id, sequence, chunk)
        await asyncio.sleep(0.05)
    await journal.finish(request_id, DONE)

    live, resumed = await asyncio.wait_for(asyncio.gather(live_reader, resumed_reader), timeout=5)
    assert b"".join(e.data for e in live) == b"".join(chunks)
    assert [e.sequence for e in live[:-1]] == list(range(6))
    assert live[-1].final == {"status": DONE, "error": None, "usage": None}
    assert b"".join(chunks[:2]) + b"".join(e.data for e in resumed) == b"".join(chunks)
    assert await read_all(5) == [live[-1]]


async def test_resume_from_a_trimmed_sequence_is_refused(client):
    store = RequestStore(client)
    journal = OutputJournal(client, store, max_entries=3)
    request_id = (await store.create("speech", model="m")).request_id
    for sequence in range(6):
        await journal.append(request_id, sequence, b"x")
    await journal.finish(request_id, DONE)
    with pytest.raises(JournalTrimmed):
        _ = [entry async for entry in journal.read(request_id, after_sequence=0)]
    assert [e.sequence for e in [entry async for entry in journal.read(request_id, after_sequence=3)]][:2] == [4, 5]


async def test_a_request_ended_without_its_end_marker_ends_its_readers_as_its_record_says(client):
    """The run's process died between the record's last write and the end marker's (or the request was cancelled
    while queued): readers get the end marker the run would have written, never a stream that just stops."""
    store = RequestStore(client)
    journal = OutputJournal(client, store, block_ms=50)

    async def ended(status: str, num_chunks: int, **fields) -> str:
        request_id = (await store.create("speech", model="m")).request_id
        await store.transition(request_id, RUNNING)
        for sequence in range(num_chunks):
            await journal.append(request_id, sequence, b"a")
        await store.transition(request_id, status, **fields)
        return request_id

    async def read(request_id: str, after_sequence: int | None = None):
        entries = await asyncio.wait_for(_collect(journal.read(request_id, after_sequence)), timeout=2)
        return [e.data for e in entries if e.final is None], entries[-1].final

    failed = await ended(FAILED, 1, error={"code": "UNAVAILABLE", "message": "talker went away"})
    assert await read(failed) == (
        [b"a"],
        {"status": FAILED, "error": {"code": "UNAVAILABLE", "message": "talker went away"}, "usage": None},
    )
    usage = {"audio_s": 0.2, "last_sequence": 1}
    done = await ended(DONE, 2, usage=usage, last_sequence=1)
    assert await read(done) == ([b"a", b"a"], {"status": DONE, "error": None, "usage": usage})
    assert await read(done, after_sequence=1) == ([], {"status": DONE, "error": None, "usage": usage})
    # Done with a chunk the journal does not hold: a failure, not a short stream that says done.
    short = await ended(DONE, 1, usage=usage, last_sequence=1)
    chunks, final = await read(short)
    assert chunks == [b"a"] and final["status"] == FAILED and final["error"]["code"] == "DATA_LOSS", final
    assert "reached chunk 0" in final["error"]["message"] and "chunk 1 as its last" in final["error"]["message"]
    queued = (await store.create("speech", model="m")).request_id
    assert await store.request_cancel(queued) == CANCELLED
    assert await read(queued) == ([], {"status": CANCELLED, "error": None, "usage": None})


async def _collect(iterator):
    return [item async for item in iterator]


async def test_cancel_queued_is_immediate_and_running_reaches_the_other_replica(client, other_client):
    store, other_store = RequestStore(client), RequestStore(other_client)
    queued_id = (await store.create("speech", model="m")).request_id
    assert await other_store.request_cancel(queued_id) == CANCELLED
    assert (await store.get(queued_id)).status == CANCELLED

    running_id = (await store.create("speech", model="m")).request_id
    await store.transition(running_id, RUNNING)
    # A long poll interval: only the pub/sub hint can wake the waiter within the bound below.
    cancels = CancelListener(store, poll_interval_s=30)
    with cancels.watch(running_id) as watch, cancels.watch("another-request") as other_watch:
        waiter = asyncio.create_task(watch.wait())
        other_waiter = asyncio.create_task(other_watch.wait())
        await asyncio.sleep(0.2)
        assert not waiter.done()
        started = time.monotonic()
        assert await other_store.request_cancel(running_id) == RUNNING
        await asyncio.wait_for(waiter, timeout=2)
        assert time.monotonic() - started < 1.0
        assert not other_waiter.done()  # one subscription, but only the cancelled request's waiter returns
        other_waiter.cancel()
    await cancels.close()
    assert await store.transition(running_id, CANCELLED)
    assert await store.request_cancel(running_id) == CANCELLED  # already over: no change


async def test_a_cancel_published_while_the_subscription_is_down_still_stops_the_waiter(client, other_client):
    store, other_store = RequestStore(client), RequestStore(other_client)
    running_id = (await store.create("speech", model="m")).request_id
    await store.transition(running_id, RUNNING)
    cancels = CancelListener(store, poll_interval_s=30, retry_interval_s=0.2)
    with cancels.watch(running_id) as watch:
        waiter = asyncio.create_task(watch.wait())
        await asyncio.sleep(0.2)
        await other_client.client_kill_filter(_type="pubsub")  # the listener's connection drops
        started = time.monotonic()
        assert await other_store.request_cancel(running_id) == RUNNING  # nobody hears this message
        await asyncio.wait_for(waiter, timeout=2)  # resubscribed, then every waiter read its flag
        assert time.monotonic() - started < 1.0
    await cancels.close()


async def test_idempotency_key_maps_to_the_first_request(client, other_client):
    """Admitting claims the key with the record and the run, all or nothing: a twin gets the first request."""
    stream = f"chorus:runs:{time.monotonic_ns()}"
    first, second = RunQueue(client, "replica-a", 2.0, stream), RunQueue(other_client, "replica-b", 2.0, stream)
    store = RequestStore(client)
    key = f"idem-{time.monotonic_ns()}"

    async def admit(queue: RunQueue, owner: str) -> tuple[bool, str]:
        _, fields = store.new_record("speech", "m", owner=owner)
        return await queue.admit(fields, b"spec", 60, (keys.idempotency(owner, key), 60))

    is_new, _ = await admit(first, "owner")
    assert is_new
    first_id = await store.idempotent_request("owner", key)
    assert await admit(second, "owner") == (False, first_id)
    assert (await admit(second, "other-owner"))[0]
    assert (await store.get(first_id)).status == "queued"


@pytest.mark.parametrize(
    ("ending", "is_replayed"),
    [
        ((DONE, None), True),
        ((FAILED, {"code": "INVALID_ARGUMENT", "message": "voice: unknown"}), True),  # the client's: same answer
        ((FAILED, {"code": "UNAVAILABLE", "message": "no healthy talker replica"}), False),  # the server's: run again
        ((FAILED, {"code": "INTERNAL", "message": "internal error"}), False),
        ((CANCELLED, None), True),  # cancelled as the client asked
        ((CANCELLED, {"code": "CANCELLED", "message": "the client went away"}), False),  # it came back: run again
        (None, False),  # the record expired: nothing to answer with
    ],
)
async def test_a_retry_with_an_idempotency_key_gets_its_request_unless_it_failed_on_the_servers_side_or_was_left(
    client, ending, is_replayed
):
    queue, store = RunQueue(client, "replica-a", 2.0, f"chorus:runs:{time.monotonic_ns()}"), RequestStore(client)
    key = f"idem-{time.monotonic_ns()}"

    async def admit() -> tuple[bool, str]:
        _, fields = store.new_record("speech", "m", owner="owner")
        return await queue.admit(fields, b"spec", 60, (keys.idempotency("owner", key), 60))

    assert (await admit())[0]
    first_id = await store.idempotent_request("owner", key)
    if ending is None:
        await client.delete(keys.record(first_id))
    else:
        status, error = ending
        await store.transition(first_id, RUNNING)
        await store.transition(first_id, status, **({"error": error} if error else {}))
    if is_replayed:
        assert await store.idempotent_request("owner", key) == first_id
        assert await admit() == (False, first_id)
    else:
        assert await store.idempotent_request("owner", key) is None  # released: the retry is admitted anew
        is_new, _ = await admit()
        assert is_new and await store.idempotent_request("owner", key) not in (None, first_id)


def test_api_keys_are_checked_and_held_hashed():
    assert ApiKeys(()).authenticate(None) == ""
    api_keys = ApiKeys(("secret-one", "sha256:" + hash_key("secret-two")))
    assert api_keys.authenticate("secret-one") == hash_key("secret-one")[:12]
    assert api_keys.authenticate("secret-two") == hash_key("secret-two")[:12]
    for bad in (None, "", "secret-three", "sha256:" + hash_key("secret-two")):
        with pytest.raises(Unauthorized):
            api_keys.authenticate(bad)
    assert all("secret" not in held for held in api_keys._hashes)


async def test_token_bucket_holds_across_replicas(client, other_client):
    key_id = f"key-{time.monotonic_ns()}"
    limiters = [RateLimiter(client, rate_per_s=2.0, burst=3), RateLimiter(other_client, rate_per_s=2.0, burst=3)]
    for i in range(3):
        await limiters[i % 2].take(key_id)
    with pytest.raises(Overloaded) as refused:
        await limiters[1].take(key_id)
    assert 0 < refused.value.retry_after_s <= 0.5
    await asyncio.sleep(refused.value.retry_after_s + 0.05)
    await limiters[0].take(key_id)
    await RateLimiter(client, rate_per_s=0, burst=0).take(key_id)  # disabled: never refuses


async def test_redis_outage_is_unavailable_fast():
    client = open_redis(f"redis://127.0.0.1:{free_port()}/0")
    store = RequestStore(client)
    operations = [
        store.create("speech", model="m"),
        store.get("x"),
        store.request_cancel("x"),
        RateLimiter(client, 1.0, 1).take("k"),
    ]
    for operation in operations:
        started = time.monotonic()
        with pytest.raises(Unavailable, match="Redis"):
            await operation
        assert time.monotonic() - started < 1.0
    await client.aclose()


async def test_runs_handed_over_are_taken_at_once_and_lapsed_leases_after_the_lease(client, other_client):
    stream = f"chorus:runs:{time.monotonic_ns()}"
    owner, other = RunQueue(client, "owner", 0.5, stream), RunQueue(other_client, "other", 0.5, stream)
    store = RequestStore(client)
    entry_ids = []
    for _ in range(2):
        _, fields = store.new_record("speech", "m")
        entry_ids.append((await owner.admit(fields, b"spec", 60, None))[1])
    assert await owner.heartbeat() == set(entry_ids) and await other.reclaim() == []  # leased
    await owner.release(entry_ids[:1])  # SIGTERM: handed over
    assert [entry.entry_id for entry in await other.reclaim()] == entry_ids[:1]
    await asyncio.sleep(1.0)  # the owner stopped renewing: the other lease lapses too
    assert entry_ids[1] in [entry.entry_id for entry in await other.reclaim()]
    assert await owner.heartbeat() == set()  # and the owner learns it owns neither any more
