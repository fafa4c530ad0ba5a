"""Long-input segmentation, and the ordering contract of concurrently synthesised segments."""

from __future__ import annotations

import asyncio
import random

import pytest

from chorus.gateway.ordered import ordered_concurrent
from chorus.gateway.segmenter import split_segments

ENGLISH = (
    "The quick brown fox jumps over the lazy dog. It costs 3.14 dollars, or so they say! "
    'Did he really say "no way?" Yes.\nA new paragraph starts here; it goes on, and on, and on '
    "without a single full stop for quite a long while until finally it ends."
)
CHINESE = "今天天气很好。我们一起去公园散步吧！你觉得怎么样？好的，我们下午三点出发；记得带水。"
MIXED = "Qwen3-TTS speaks 中文 and English. 这是第二句。And a third sentence… then more!"


@pytest.mark.parametrize("text", [ENGLISH, CHINESE, MIXED, "", "   ", "no punctuation at all " * 20])
@pytest.mark.parametrize("max_chars", [1, 7, 30, 80, 1000])
def test_segments_keep_every_character_and_respect_the_limit(text, max_chars):
    segments = split_segments(text, max_chars)
    assert "".join(segments) == text
    assert all(0 < len(segment) <= max_chars for segment in segments)


def test_splits_fall_on_sentence_boundaries_when_sentences_fit():
    segments = split_segments(ENGLISH, 90)
    # Two sentences packed ("3.14" is no boundary); the next sentence would not fit.
    assert segments[0] == "The quick brown fox jumps over the lazy dog. It costs 3.14 dollars, or so they say! "
    # The 135-character last sentence is cut at a comma, its first part packed after the short ones.
    assert segments[1] == 'Did he really say "no way?" Yes.\nA new paragraph starts here; it goes on, and on, '
    assert segments[2] == "and on without a single full stop for quite a long while until finally it ends."


def test_cjk_sentences_split_after_full_width_punctuation():
    segments = split_segments(CHINESE, 20)
    assert segments[0] == "今天天气很好。我们一起去公园散步吧！"
    assert all(segment[-1] in "。！？；" for segment in segments[:-1])


def test_over_long_sentence_is_cut_at_a_clause_then_a_space():
    sentence = "first clause here, second clause here, third clause is long enough"
    assert split_segments(sentence, 40) == ["first clause here, second clause here, ", "third clause is long enough"]
    assert split_segments("alpha beta gamma delta", 12) == ["alpha beta ", "gamma delta"]
    assert split_segments("一二三四五六七八九十", 4) == ["一二三四", "五六七八", "九十"]


def test_short_sentences_are_packed_together():
    assert split_segments("A. B. C. D.", 6) == ["A. B. ", "C. D."]
    with pytest.raises(ValueError, match="max_chars"):
        split_segments("x", 0)


async def test_joins_come_out_in_segment_order_whatever_finishes_first():
    rng = random.Random(0)
    segments = split_segments(ENGLISH + " " + CHINESE, 25)
    num_running = num_running_max = 0

    async def synthesise(segment: str):
        nonlocal num_running, num_running_max
        num_running += 1
        num_running_max = max(num_running_max, num_running)
        try:
            for position in range(0, len(segment), 4):  # a few "audio chunks" per segment
                await asyncio.sleep(rng.uniform(0, 0.004))
                yield segment[position : position + 4]
        finally:
            num_running -= 1

    chunks = [chunk async for chunk in ordered_concurrent(segments, synthesise, max_concurrency=3)]
    assert "".join(chunks) == ENGLISH + " " + CHINESE
    assert num_running_max == 3


async def test_first_segment_streams_before_later_ones_finish():
    later_started = asyncio.Event()
    release_later = asyncio.Event()

    async def synthesise(index: int):
        if index == 0:
            await later_started.wait()  # segment 1 is running concurrently
            yield "first"
        else:
            later_started.set()
            await release_later.wait()
            yield "second"

    stream = ordered_concurrent([0, 1], synthesise, max_concurrency=2)
    assert await asyncio.wait_for(anext(stream), timeout=1) == "first"  # while segment 1 still runs
    release_later.set()
    assert await anext(stream) == "second"
    await stream.aclose()


async def test_a_failing_segment_raises_in_order_and_stopping_cancels_the_rest():
    cancelled = []

    async def synthesise(index: int):
        try:
            if index == 1:
                raise RuntimeError("talker failed on segment 1")
            yield f"chunk-{index}"
            await asyncio.sleep(10 if index > 1 else 0)
        except asyncio.CancelledError:
            cancelled.append(index)
            raise

    received = []
    with pytest.raises(RuntimeError, match="segment 1"):
        async for chunk in ordered_concurrent([0, 1, 2, 3], synthesise, max_concurrency=4):
            received.append(chunk)
    assert received == ["chunk-0"]
    assert sorted(cancelled) == [2, 3]


async def test_later_segments_pause_when_their_buffer_is_full():
    produced = {0: 0, 1: 0}
    release_first = asyncio.Event()

    async def synthesise(index: int):
        if index == 0:
            await release_first.wait()
        for _ in range(50):
            produced[index] += 1
            yield index

    stream = ordered_concurrent([0, 1], synthesise, max_concurrency=2, max_buffered_chunks=4)
    consumer = asyncio.create_task(anext(stream))
    await asyncio.sleep(0.05)
    assert produced[1] <= 5  # 4 buffered + 1 waiting to be put: segment 1 paused, not racing ahead
    release_first.set()
    assert await consumer == 0
    rest = [chunk async for chunk in stream]
    assert rest == [0] * 49 + [1] * 50
