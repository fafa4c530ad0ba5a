"""The diffusion engine: one worker thread steps every live sample; asyncio code only enqueues and reads.

    engine = DiffusionEngine(models, max_batch_size=8)
    engine.start()
    request = validate_request(engine.limits, request_id="r1", prompt="rain", duration_s=5, seed=1)
    async for event in engine.generate(request):   # StepProgress…, AudioOutput per output, then Finished
        ...
    engine.stop()

Leaving the `async for` early (client gone, task cancelled) aborts the request; `abort(request_id)` does
the same from anywhere. Both take effect before the next step and free the request's slots at once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from chorus.diffusion.engine.request import (
    AudioOutput,
    Event,
    Finished,
    FinishReason,
    GenerationRequest,
    InvalidGenerationParameter,
    RequestLimits,
    StepProgress,
)
from chorus.diffusion.engine.runner import Denoiser, DiffusionRunner, SampleSpec, SampleState
from chorus.diffusion.engine.scheduler import BatchScheduler, Entry
from chorus.diffusion.loader import StableAudioModels
from chorus.runtime.tasks import exit_if_it_raises

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepStats:
    """One engine step, for metrics: samples advanced and host wall time (DiT and sampler; with CUDA it
    includes the GPU time once the launch queue is full)."""

    num_samples: int
    num_requests: int
    step_time_s: float


@dataclass(frozen=True, slots=True)
class EngineLoad:
    num_live_requests: int
    num_free_slots: int
    queue_depth: int


@dataclass(eq=False)
class _LiveRequest(Entry):
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    states: list[SampleState] = field(default_factory=list)
    is_cancelled: bool = False
    scheduled_s: float | None = None
    first_output_s: float | None = None

    @property
    def steps_done(self) -> int:
        return self.states[0].step_index if self.states else 0

    def send(self, event: Event) -> None:
        if self.first_output_s is None:
            self.first_output_s = time.monotonic()
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:
            logger.debug("event loop of request %s is closed; dropping %s", self.request_id, type(event).__name__)


class DiffusionEngine:
    """Batches Stable Audio Open requests on one device; see the module docstring for the API."""

    def __init__(
        self,
        models: StableAudioModels,
        *,
        max_batch_size: int = 8,
        batch_window_ms: float = 0.0,
        max_queue_size: int = 64,
        default_num_steps: int = 100,
        default_guidance_scale: float = 7.0,
        use_cuda_graphs: bool = True,
        compile_dit: bool = False,
        compile_mode: str = "default",
        attention_backend: str = "auto",
        denoiser: Denoiser | None = None,
        on_step: Callable[[StepStats], None] | None = None,
    ) -> None:
        """use_cuda_graphs only acts on CUDA devices and not with a given `denoiser`, compile_dit only where graphs
        are captured; see DiffusionRunner (also for compile_mode, attention_backend and denoiser)."""
        is_cuda = models.device.type == "cuda" and denoiser is None
        # Two DiT rows per sample: CFG runs the unconditional branch in the same forward.
        max_graph_rows = 2 * max_batch_size if use_cuda_graphs and is_cuda else 0
        self.runner = DiffusionRunner(
            models,
            max_graph_rows=max_graph_rows,
            compile_dit=compile_dit and max_graph_rows > 0,
            compile_mode=compile_mode,
            attention_backend=attention_backend,
            denoiser=denoiser,
        )
        self.limits = RequestLimits(
            max_duration_s=models.max_duration_s,
            max_num_outputs=max_batch_size,
            default_num_steps=default_num_steps,
            default_guidance_scale=default_guidance_scale,
        )
        self._scheduler: BatchScheduler[_LiveRequest] = BatchScheduler(
            max_batch_size, batch_window_ms / 1000, max_queue_size
        )
        self._on_step = on_step
        self._lock = threading.Condition()
        self._by_id: dict[str, _LiveRequest] = {}
        self._is_stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        assert self._thread is None
        self._thread = threading.Thread(
            target=exit_if_it_raises(self._run, "diffusion engine"), name="diffusion-engine", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stops the worker after its current step and frees its CUDA graphs; every unfinished request
        ends as cancelled. The engine cannot be started again."""
        with self._lock:
            self._is_stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.runner.close()
        with self._lock:
            for live in list(self._by_id.values()):
                self._finish(live, FinishReason.CANCELLED)

    def load(self) -> EngineLoad:
        with self._lock:
            return EngineLoad(len(self._scheduler.running), self._scheduler.num_free_slots, self._scheduler.queue_depth)

    def submit(self, request: GenerationRequest) -> asyncio.Queue[Event]:
        """Queues a validated request; call from the event loop that reads the returned queue.

        Raises InvalidGenerationParameter for a request_id already live, Overloaded when the queue is full."""
        live = _LiveRequest(
            request_id=request.request_id,
            num_samples=request.num_outputs,
            arrival_s=time.monotonic(),
            request=request,
            loop=asyncio.get_running_loop(),
            events=asyncio.Queue(),
        )
        with self._lock:
            if request.request_id in self._by_id:
                raise InvalidGenerationParameter("request_id", f"{request.request_id!r} is already running")
            self._scheduler.add(live)
            self._by_id[request.request_id] = live
            self._lock.notify_all()
        return live.events

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Submits `request` and yields its events; the last one is always `Finished`."""
        events = self.submit(request)
        is_finished = False
        try:
            while not is_finished:
                event = await events.get()
                is_finished = isinstance(event, Finished)
                yield event
        finally:
            if not is_finished:
                self.abort(request.request_id)

    def abort(self, request_id: str) -> bool:
        """Cancels a live request before its next step; False when it is unknown or already finished."""
        with self._lock:
            live = self._by_id.get(request_id)
            if live is None:
                return False
            live.is_cancelled = True
            self._lock.notify_all()
            return True

    def _run(self) -> None:
        while True:
            with self._lock:
                admitted = self._wait_for_work()
                if admitted is None:
                    return
                batch = list(self._scheduler.running)
            try:
                self._start(admitted)
                self._step(batch)
            except Exception:
                logger.exception("diffusion step failed; failing the %d requests of the batch", len(batch))
                with self._lock:
                    for live in batch:
                        self._finish(live, FinishReason.ERROR, "INTERNAL", "generation failed")

    def _wait_for_work(self) -> list[_LiveRequest] | None:
        """Under the lock: drops cancelled and expired requests, admits new ones, and returns once a batch
        can run (the newly admitted requests) or None when stopping."""
        while not self._is_stopping:
            now_s = time.monotonic()
            for live in list(self._by_id.values()):
                if live.is_cancelled:
                    self._finish(live, FinishReason.CANCELLED)
                elif live.request.deadline_s is not None and now_s >= live.request.deadline_s:
                    self._finish(live, FinishReason.ERROR, "DEADLINE_EXCEEDED", "deadline passed during generation")
            admitted = self._scheduler.admit(now_s)
            for live in admitted:
                live.scheduled_s = now_s
            if self._scheduler.running:
                return admitted
            timeout_s = self._scheduler.seconds_until_admission(now_s) if self._scheduler.waiting else None
            self._lock.wait(timeout_s)
        return None

    def _start(self, admitted: list[_LiveRequest]) -> None:
        specs = [
            SampleSpec(
                prompt=live.request.prompt,
                negative_prompt=live.request.negative_prompt,
                start_s=live.request.start_s,
                end_s=live.request.start_s + live.request.duration_s,
                guidance_scale=live.request.guidance_scale,
                num_steps=live.request.num_steps,
                seed=live.request.output_seed(index),
            )
            for live in admitted
            for index in range(live.request.num_outputs)
        ]
        if not specs:
            return
        states = iter(self.runner.start(specs))
        for live in admitted:
            live.states = [next(states) for _ in range(live.request.num_outputs)]

    def _step(self, batch: list[_LiveRequest]) -> None:
        started_s = time.monotonic()
        self.runner.step([state for live in batch for state in live.states])
        if self._on_step is not None:
            num_samples = sum(len(live.states) for live in batch)
            self._on_step(StepStats(num_samples, len(batch), time.monotonic() - started_s))
        for live in batch:
            live.send(StepProgress(step=live.steps_done, num_steps=live.request.num_steps))
            if live.steps_done == live.request.num_steps:
                self._complete(live)

    def _complete(self, live: _LiveRequest) -> None:
        """Decodes a finished request output by output, so VAE memory does not grow with the batch."""
        for index, state in enumerate(live.states):
            waveform = self.runner.decode(state, live.request.sample_format)
            live.send(AudioOutput(index=index, waveform=waveform, sample_rate_hz=self.runner.models.sample_rate_hz))
        with self._lock:
            self._finish(live, FinishReason.COMPLETE)

    def _finish(self, live: _LiveRequest, reason: FinishReason, code: str | None = None, message: str | None = None):
        """Under the lock: sends the final event once and frees the request's slots."""
        if self._by_id.get(live.request_id) is not live:
            return
        del self._by_id[live.request_id]
        self._scheduler.remove(live)
        now_s = time.monotonic()
        is_complete = reason is FinishReason.COMPLETE
        live.send(
            Finished(
                reason=reason,
                num_steps_run=live.steps_done,
                audio_s=live.request.duration_s * live.request.num_outputs if is_complete else 0.0,
                num_prompt_tokens=live.states[0].conditioning.num_prompt_tokens if live.states else 0,
                queue_ms=_ms(live.arrival_s, live.scheduled_s or now_s),
                first_output_ms=_ms(live.arrival_s, live.first_output_s or now_s),
                total_ms=_ms(live.arrival_s, now_s),
                error_code=code,
                error_message=message,
            )
        )
        live.states = []


def _ms(start_s: float, end_s: float) -> float:
    return (end_s - start_s) * 1000
