"""Scheduling policy (pure logic): slot packing, prefill limit, output back-pressure, waiting for text."""

from __future__ import annotations

import torch

from chorus.talker.engine.request import Status, TalkerRequest
from chorus.talker.engine.scheduler import Scheduler
from chorus.talker.prompt import Prompt, VoiceRequest
from chorus.talker.sampling import SamplingParams

PAD = 151671


def _request(name: str, text_complete: bool = True, text_ids=(5, 6, 7)) -> TalkerRequest:
    voice = VoiceRequest("voice_design", [1, 2, 3], list(text_ids), text_complete=text_complete)
    return TalkerRequest(name, voice, SamplingParams(), seed=0, max_frames=10, max_buffered_frames=2)


def _admit(scheduler: Scheduler, request: TalkerRequest, trailing=(), streams_text=False) -> None:
    scheduler.add(request)
    plan = scheduler.plan()
    assert request in plan.prefill
    request.prompt = Prompt([], list(trailing), streams_text)


def test_lowest_free_slot_first_and_prefill_limit():
    scheduler = Scheduler(num_slots=4, max_prefills_per_step=2, pad_text_id=PAD, max_positions=4096)
    requests = [_request(str(i)) for i in range(3)]
    for request in requests:
        scheduler.add(request)
    first = scheduler.plan()
    assert [r.slot for r in first.prefill] == [0, 1] and requests[2].status is Status.WAITING
    for request in first.prefill:
        request.prompt = Prompt([], [], False)
    second = scheduler.plan()
    assert second.prefill == [requests[2]] and requests[2].slot == 2
    assert second.decode == requests[:2] and second.decode_text_ids == [PAD, PAD]
    requests[2].prompt = Prompt([], [], False)
    scheduler.finish(requests[0])
    late = _request("late")
    scheduler.add(late)
    scheduler.plan()
    assert late.slot == 0 and scheduler.num_free_slots == 1


def test_full_output_pauses_only_that_request():
    scheduler = Scheduler(num_slots=2, max_prefills_per_step=2, pad_text_id=PAD, max_positions=4096)
    slow, fast = _request("slow"), _request("fast")
    _admit(scheduler, slow)
    _admit(scheduler, fast)
    slow.buffered_frames = 2
    assert scheduler.plan().decode == [fast]
    slow.buffered_frames = 1
    assert scheduler.plan().decode == [slow, fast]


def test_a_resumed_streaming_text_request_waits_for_its_prefix_frames_text():
    scheduler = Scheduler(num_slots=2, max_prefills_per_step=2, pad_text_id=PAD, max_positions=4096)
    request = _request("r", text_complete=False, text_ids=(9,))
    request.voice.prefix_frames = torch.zeros(2, 16, dtype=torch.long)  # the steps of frames 0, 1 fed ids 2 and 3
    scheduler.add(request)
    for _ in range(2):
        assert scheduler.plan().prefill == []
        request.voice.text_ids.append(9)
    assert scheduler.plan().prefill == [request]


def test_streaming_text_waits_for_text():
    scheduler = Scheduler(num_slots=2, max_prefills_per_step=2, pad_text_id=PAD, max_positions=4096)
    request = _request("r", text_complete=False, text_ids=())
    scheduler.add(request)
    assert scheduler.plan().prefill == [], "no token yet: the prompt cannot be built"
    request.voice.text_ids.append(9)
    assert scheduler.plan().prefill == [request]
    request.prompt = Prompt([], [10], streams_text=True)
    plan = scheduler.plan()
    assert plan.decode == [request] and plan.decode_text_ids == [10]
    request.num_frames = request.num_launched = 1
    assert scheduler.plan().decode == [], "text not arrived: wait rather than invent"
    request.prompt.streams_text = False
    assert scheduler.plan().decode_text_ids == [PAD]


def test_a_frame_in_flight_counts_against_the_output_bound_and_the_limits():
    scheduler = Scheduler(num_slots=1, max_prefills_per_step=1, pad_text_id=PAD, max_positions=12)
    request = _request("r")
    _admit(scheduler, request)
    request.num_launched, request.num_frames, request.buffered_frames = 2, 1, 1  # one launched, not yet read
    assert scheduler.plan().decode == [], "1 buffered + 1 in flight fills the 2-frame output"
    request.buffered_frames = 0
    assert scheduler.plan().decode == [request]
    request.num_launched = request.max_frames
    assert scheduler.plan().decode == [], "max_frames counts launched frames"
    request.num_launched, request.num_prompt_positions = 3, 9
    assert scheduler.plan().decode == [], "position 12 would be past the cache"


def test_a_preempted_request_queues_again_in_admission_order_and_a_full_cache_holds_the_queue():
    scheduler = Scheduler(num_slots=3, max_prefills_per_step=3, pad_text_id=PAD, max_positions=4096)
    first, second, third = (_request(name) for name in ("first", "second", "third"))
    for arrival, request in enumerate((first, second, third)):
        request.arrival = arrival
        scheduler.add(request)
    assert scheduler.plan().prefill == [first, second, third]
    for request in (first, second, third):
        request.prompt = Prompt([], [], False)
    scheduler.preempt(third)
    scheduler.preempt(first)
    assert third.slot is None and first.status is Status.WAITING and scheduler.num_free_slots == 2
    late = _request("late")
    late.arrival = 3
    scheduler.add(late)
    scheduler.requeue(third)
    scheduler.requeue(first)
    assert list(scheduler.waiting) == [first, third, late]
    no_room_for_third = scheduler.plan(has_room=lambda request: request is not third)
    assert no_room_for_third.prefill == [first] and list(scheduler.waiting) == [third, late]  # late waits behind it
