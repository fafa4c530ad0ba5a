"""Scheduling policy of the talker engine: slots, admission, who advances this step. Pure Python, no torch.

Each step: admit waiting requests whose prompt is ready into free slots (lowest index first, so live rows stay
packed at the low end and decode batches stay small), at most `max_prefills_per_step` of them so running streams
are never starved; then every running request whose output has room and whose next text id is known advances
by one frame.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import deque
from collections.abc import Callable

from chorus.talker.engine.request import Status, TalkerRequest


@dataclasses.dataclass
class StepPlan:
    prefill: list[TalkerRequest]
    decode: list[TalkerRequest]
    decode_text_ids: list[int]


class Scheduler:
    def __init__(self, num_slots: int, max_prefills_per_step: int, pad_text_id: int, max_positions: int) -> None:
        self.num_slots = num_slots
        self.max_positions = max_positions
        self.max_prefills_per_step = max_prefills_per_step
        self.pad_text_id = pad_text_id
        self.waiting: deque[TalkerRequest] = deque()
        self.running: dict[int, TalkerRequest] = {}
        self._free_slots = list(range(num_slots))

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def add(self, request: TalkerRequest) -> None:
        """Queues an admitted request. The bound on admitted requests is the engine's (`submit`): several may
        arrive in one step before any is placed, so a second bound here would strand them."""
        self.waiting.append(request)

    def plan(self, has_room: Callable[[TalkerRequest], bool] = lambda request: True) -> StepPlan:
        """`has_room(request)`: whether the KV cache can take a waiting request now; the queue waits behind the
        first that it cannot, so requests start in order."""
        prefill = []
        for request in list(self.waiting):
            if len(prefill) == self.max_prefills_per_step or not self._free_slots:
                break
            if request.prompt_ready and not has_room(request):
                break
            if request.prompt_ready:
                self.waiting.remove(request)
                request.slot = heapq.heappop(self._free_slots)
                request.status = Status.RUNNING
                self.running[request.slot] = request
                prefill.append(request)
        decode, text_ids = [], []
        for slot in sorted(self.running):
            request = self.running[slot]
            if request in prefill or not request.can_launch(self.max_positions):
                continue
            text_id = request.trailing_text_id(self.pad_text_id)
            if text_id is not None:
                decode.append(request)
                text_ids.append(text_id)
        return StepPlan(prefill, decode, text_ids)

    def preempt(self, request: TalkerRequest) -> None:
        """Take a running request off its slot; it is out of the queue too until `requeue`."""
        del self.running[request.slot]
        heapq.heappush(self._free_slots, request.slot)
        request.slot, request.status = None, Status.WAITING

    def requeue(self, request: TalkerRequest) -> None:
        """Queue a preempted request again in admission order, ahead of every request admitted after it."""
        later = (index for index, other in enumerate(self.waiting) if other.arrival > request.arrival)
        self.waiting.insert(next(later, len(self.waiting)), request)

    def finish(self, request: TalkerRequest) -> None:
        """Release the request's slot (or queue place) at once."""
        if request.status is Status.RUNNING:
            del self.running[request.slot]
            heapq.heappush(self._free_slots, request.slot)
        elif request.status is Status.WAITING and request in self.waiting:
            self.waiting.remove(request)
        request.status = Status.FINISHED
