"""The talker engine: the step loop on its own thread, and the thread-safe request API for asyncio callers.

Callers (the gRPC servicer) call `submit` → `FrameStream`, then `add_text` / `end_text` / `abort`; those only
enqueue commands, so the event loop never waits for a model step. The engine thread applies commands at the
start of each step, asks the scheduler for a plan, launches one decode step, runs prefills, and hands out the frames
of the step before.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import logging
import random
import sys
import threading
import time
from collections import deque

import numpy as np
import torch

from chorus.runtime.streams import use_own_stream
from chorus.runtime.tasks import exit_if_it_raises
from chorus.talker.engine.kv_blocks import BLOCK_SIZE, blocks_for
from chorus.talker.engine.prefill import LENGTH_BUCKETS
from chorus.talker.engine.request import FinishReason, Status, TalkerRequest
from chorus.talker.engine.runner import (
    BATCH_BUCKETS,
    DecodeLaunch,
    TalkerRunner,
    kv_bytes_per_position,
    positions_for_memory,
)
from chorus.talker.engine.scheduler import Scheduler
from chorus.talker.engine.stream import FrameStream
from chorus.talker.loader import LoadedTalker
from chorus.talker.prompt import PromptError, VoiceRequest, build_prompt, validate
from chorus.talker.sampling import SamplingParams

FRAME_RATE_HZ = 12.5
AUTO_SLOTS_CUDA = BATCH_BUCKETS[-1]  # max_streams 0 on CUDA: the largest decode batch, sharing a paged KV pool
AUTO_SLOTS_ELSEWHERE = 64
# The event loop's thread hands the GIL to the engine thread only after this long (CPython's default is 5 ms): with
# gRPC traffic on the loop, the default could idle the GPU for most of a 6 ms step each time the engine came back
# from waiting on it.
GIL_SWITCH_INTERVAL_S = 0.0005
_log = logging.getLogger(__name__)


class EngineFullError(RuntimeError):
    """No room for another request (slots and queue taken); callers answer RESOURCE_EXHAUSTED."""


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    max_streams: int = 64  # decode slots; 0: 256 on CUDA (the largest decode batch bucket), 64 elsewhere
    max_positions: int = 4608  # cache positions per stream: prompt + frames
    # The KV pool all streams share. A pool smaller than max_streams × max_positions serves more streams in the same
    # memory: when it runs dry, the newest streams are preempted and later resume exactly where they stopped (their
    # frames recomputed as a prefill). 0: on CUDA, what `kv_memory_fraction` of the free memory holds, at most
    # max_streams × max_positions; elsewhere max_streams × max_positions, so no stream ever waits for one.
    kv_cache_positions: int = 0
    max_frames: int = 4096  # default and upper limit of frames per request
    max_queue: int = 256  # requests waiting for a slot or for text
    max_buffered_frames: int = 50  # per-stream output bound (4 s of audio)
    max_prefills_per_step: int = 32
    use_cuda_graphs: bool = True
    compile_step: bool = False
    few_rows_matmul: bool = True  # with compile_step on CUDA: decode steps of ≤ 2 rows through fused Triton kernels
    stream_priority: int | None = None  # run on a CUDA stream of this priority (None: the default stream)
    kv_memory_fraction: float = 0.5  # leaves the rest to graphs and the engines beside it on the same GPU


@dataclasses.dataclass(frozen=True)
class EngineLoad:
    live_streams: int
    free_slots: int
    queue_depth: int


@dataclasses.dataclass
class EngineStats:
    """Cumulative counters for metrics; the engine thread writes, readers take a snapshot."""

    steps: int = 0
    frames: int = 0
    rows_computed: int = 0  # rows the steps computed: active ones, then idle ones below them and up to a bucket
    last_step_ms: float = 0.0
    last_batch_size: int = 0
    step_ms_total: float = 0.0
    prefills: int = 0  # requests prefilled
    prefill_ms_total: float = 0.0  # engine-thread time in batched prefills (the GPU runs launched steps meanwhile)
    prefill_cpu_ms_total: float = 0.0  # the thread's CPU time in them: the rest it waited (the GIL, a blocking call)
    preemptions: int = 0  # requests taken off their slot for lack of KV blocks (each resumed later)


class TalkerEngine:
    def __init__(self, loaded: LoadedTalker, config: EngineConfig = EngineConfig()) -> None:
        if config.max_prefills_per_step < 1:
            raise ValueError(f"max_prefills_per_step: must be >= 1, got {config.max_prefills_per_step}")
        if 0 < config.kv_cache_positions < config.max_positions:
            raise ValueError(
                f"kv_cache_positions: must be 0 or at least max_positions ({config.max_positions}), "
                f"got {config.kv_cache_positions}"
            )
        self.loaded = loaded
        self.model_config = loaded.config
        self.config = config
        on_cuda = loaded.model.talker.codec_head.weight.device.type == "cuda"
        self.num_slots = config.max_streams or (AUTO_SLOTS_CUDA if on_cuda else AUTO_SLOTS_ELSEWHERE)
        kv_cache_positions = config.kv_cache_positions or (self._kv_positions_from_memory(loaded) if on_cuda else 0)
        self.runner = TalkerRunner(
            loaded.model,
            self.num_slots,
            config.max_positions,
            config.use_cuda_graphs,
            config.compile_step,
            kv_cache_positions,
            config.few_rows_matmul,
            config.max_prefills_per_step,
        )
        self.kv_blocks = self.runner.kv_blocks
        pad_id = self.model_config.text_ids.tts_pad
        self.scheduler = Scheduler(self.num_slots, config.max_prefills_per_step, pad_id, config.max_positions)
        self.stats = EngineStats()
        self._requests: dict[str, tuple[TalkerRequest, FrameStream]] = {}
        self._commands: deque[tuple] = deque()
        self._in_flight: tuple[DecodeLaunch, list[TalkerRequest]] | None = None
        self._admitted = 0
        self._arrivals = itertools.count()
        # step() calls: a stream's `steps_to_first_frame` counts them from its prefill's to its first frame's
        self._num_step_calls = 0
        self._admit_lock = threading.Lock()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def _kv_positions_from_memory(self, loaded: LoadedTalker) -> int:
        """The KV pool's positions when none are set, on CUDA: what `kv_memory_fraction` of the free memory holds,
        at most every slot's `max_positions` (more could never be used)."""
        weight = loaded.model.talker.codec_head.weight
        free_bytes, _ = torch.cuda.mem_get_info(weight.device)
        per_position = kv_bytes_per_position(loaded.model, weight.dtype)
        max_positions = self.config.max_positions
        positions = positions_for_memory(free_bytes, self.config.kv_memory_fraction, per_position)
        positions = min(positions, self.num_slots * max_positions)
        if positions < max_positions:
            raise ValueError(
                f"kv_cache_positions: {self.config.kv_memory_fraction:.0%} of the {free_bytes / 2**30:.1f} GiB free "
                f"holds {positions} positions, fewer than one stream's max_positions ({max_positions}): lower "
                "max_positions, raise kv_memory_fraction or free GPU memory"
            )
        _log.info(
            "talker KV cache: %d positions (%.1f GiB) shared by %d streams, from %.1f GiB free",
            positions,
            positions * per_position / 2**30,
            self.num_slots,
            free_bytes / 2**30,
        )
        return positions

    # ---- request API (any thread) ----

    def voice_request(
        self,
        mode: str,
        text: str,
        *,
        text_complete: bool = True,
        language: str = "auto",
        speaker: str | None = None,
        instructions: str = "",
        ref_text: str = "",
        ref_codes=None,
        speaker_vector=None,
        ref_audio=None,
        non_streaming_text: bool | None = None,
        prefix_frames=None,
    ) -> VoiceRequest:
        """Tokenize a text-level request. `non_streaming_text` None → the reference's default per mode.

        Array-likes (tensors, numpy arrays, lists): `ref_codes [R, 16]`, `speaker_vector [H]`, `ref_audio [samples]`
        (24 kHz mono, in [-1, 1]), `prefix_frames [N, 16]` (fail-over: the frames this request already produced;
        it resumes at frame N, as if never interrupted).
        """

        def tensor(values, dtype):
            return None if values is None else torch.as_tensor(values, dtype=dtype)

        tokenizer = self.loaded.tokenizer
        role_ids, text_ids = tokenizer.encode_target(text)
        if non_streaming_text is None:
            non_streaming_text = mode != "voice_clone" and text_complete
        return VoiceRequest(
            mode=mode,
            role_ids=role_ids,
            text_ids=text_ids if text else [],
            text_complete=text_complete,
            language=language or "auto",
            speaker=speaker or None,
            instruct_ids=tokenizer.encode_instruct(instructions) if instructions else None,
            speaker_vector=tensor(speaker_vector, torch.float32),
            ref_audio=tensor(ref_audio, torch.float32),
            ref_text_ids=tokenizer.encode_ref_text(ref_text) if ref_codes is not None else None,
            ref_codes=tensor(ref_codes, torch.long),
            non_streaming_text=non_streaming_text,
            prefix_frames=tensor(prefix_frames, torch.long),
        )

    def submit(
        self,
        request_id: str,
        voice: VoiceRequest,
        sampling: SamplingParams | None = None,
        max_frames: int | None = None,
        ignore_eos: bool = False,
    ) -> FrameStream:
        """Validate and queue a request; its frames arrive on the returned stream.

        `max_frames` counts the whole request: a resumed one (`voice.prefix_frames`) stops where it would have
        without the interruption. Raises `PromptError` / `ValueError` for bad input (INVALID_ARGUMENT),
        `EngineFullError` when full.
        """
        validate(self.model_config, voice)
        if voice.non_streaming_text and not voice.text_complete:
            raise PromptError("streaming_text: text that keeps arriving needs the streaming-text layout")
        sampling = sampling or self.loaded.sampling_defaults
        sampling.validate()
        max_frames = max_frames or self.config.max_frames
        if not 0 < max_frames <= self.config.max_frames:
            raise ValueError(f"max_frames: must be in 1..{self.config.max_frames}, got {max_frames}")
        num_prefix_frames = voice.num_prefix_frames
        if num_prefix_frames > max_frames:
            raise PromptError(f"prefix_frames: {num_prefix_frames} frames exceed max_frames ({max_frames})")
        if num_prefix_frames and voice.text_complete:  # else known once the text arrived (checked at prefill)
            prompt = build_prompt(self.model_config, voice)
            self._check_positions(prompt.num_positions - num_prefix_frames, num_prefix_frames)
        if num_prefix_frames and sampling.seed is None and (sampling.do_sample or sampling.subtalker_do_sample):
            raise PromptError("seed: resuming a sampled request (prefix_frames) needs the seed it started with")
        seed = sampling.seed if sampling.seed is not None else random.getrandbits(63)
        with self._admit_lock:
            if request_id in self._requests:
                raise ValueError(f"request_id: {request_id!r} is already in use")
            if self._admitted >= self.num_slots + self.config.max_queue:
                raise EngineFullError(f"talker is full ({self._admitted} requests admitted)")
            request = TalkerRequest(
                request_id,
                voice,
                sampling,
                seed,
                max_frames,
                self.config.max_buffered_frames,
                ignore_eos,
                text_started=bool(voice.text_ids),
                num_frames=num_prefix_frames,
                num_launched=num_prefix_frames,
                arrival=next(self._arrivals),
            )
            if voice.prefix_frames is not None:
                request.frame_log += voice.prefix_frames.numpy().astype(np.int16).tobytes()
            stream = FrameStream(
                request_id,
                self.config.max_buffered_frames,
                lambda count: self._command("consumed", request_id, count),
                first_frame_index=num_prefix_frames,
            )
            self._requests[request_id] = (request, stream)
            self._admitted += 1
        self._command("add", request_id, None)
        return stream

    def add_text(self, request_id: str, text: str) -> None:
        """More target text for a request submitted with `text_complete=False`."""
        entry = self._requests.get(request_id)
        if entry is None or not text:
            return
        request, tokenizer = entry[0], self.loaded.tokenizer
        # The first piece is tokenized inside the template, as the reference tokenizes a whole text.
        ids = tokenizer.encode_continuation(text) if request.text_started else tokenizer.encode_target(text)[1]
        request.text_started = True
        self._command("text", request_id, ids)

    def end_text(self, request_id: str) -> None:
        self._command("end_text", request_id, None)

    def abort(self, request_id: str) -> None:
        """Cancel a request; its slot is freed at the next step boundary and its stream ends `cancelled`."""
        self._command("abort", request_id, None)

    def embed_speaker(self, audio: torch.Tensor) -> concurrent.futures.Future:
        """A future of the x-vector `[H]` (float32, on the CPU) of 24 kHz mono `audio [samples]`, computed on the engine
        thread between steps exactly as prefill computes a voice-clone request's. PromptError without an encoder."""
        if self.model_config.speaker_encoder is None:
            raise PromptError("audio: this checkpoint has no speaker encoder (voice clone needs a Base checkpoint)")
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._command("embed", "", (audio, future))
        return future

    def voices(self) -> tuple[list[str], list[str], list[str]]:
        """(modes, speakers, languages) this checkpoint serves, sorted, for `ListVoices`."""
        config = self.model_config
        modes = ["voice_design", "voice_clone"] if config.speaker_encoder is not None else ["voice_design"]
        if config.speaker_ids:
            modes.insert(0, "custom_voice")
        languages = sorted(["auto", *(name for name in config.language_ids if "dialect" not in name)])
        return modes, sorted(config.speaker_ids), languages

    def load(self) -> EngineLoad:
        live = len(self.scheduler.running)
        return EngineLoad(live, self.num_slots - live, len(self.scheduler.waiting))

    def _command(self, kind: str, request_id: str, payload) -> None:
        self._commands.append((kind, request_id, payload))
        with self._wake:
            self._wake.notify()

    # ---- engine thread ----

    def start(self) -> None:
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))
        self._stopping = False
        self._thread = threading.Thread(
            target=exit_if_it_raises(self._loop, "talker engine"), name="talker-engine", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the loop; unfinished requests end `cancelled`."""
        self._stopping = True
        with self._wake:
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        for request_id in list(self._requests):
            self._finish(self._requests[request_id][0], FinishReason.CANCELLED)

    def _loop(self) -> None:
        if self.runner.device.type == "cuda":
            torch.cuda.set_device(self.runner.device)  # graphs and streams belong to the thread's current device
        use_own_stream(self.runner.device, self.config.stream_priority)
        while not self._stopping:
            try:
                did_work = self.step()
            except Exception as error:
                # A failed step must end its requests with an error, never leave their streams hanging.
                _log.exception("talker engine step failed")
                self._fail_running(error)
                continue
            if not did_work:
                with self._wake:
                    if not self._commands and not self._stopping:
                        self._wake.wait(timeout=0.5)

    def step(self) -> bool:
        """One engine step (commands → plan → one decode step launched → prefills → the step before collected); False
        when there was nothing to do.

        The decode step goes to the GPU before the prefills' host work (building, embedding and uploading prompts),
        so that work overlaps this step and the one before it, not only the one before: at 256 streams a step's 16
        prefills took ~27 ms of host time under load against ~11 ms a step. The requests prefilled here decode from
        the next step on, as they would after a prefill run first (`plan.decode` never holds them)."""
        self._num_step_calls += 1
        self._apply_commands()
        plan = self.scheduler.plan(self._has_room)
        self._reserve_decode_blocks(plan.decode)
        started = time.perf_counter()
        decode = [r for r in plan.decode if r.status is Status.RUNNING]
        launched = None
        if decode:
            texts = [t for r, t in zip(plan.decode, plan.decode_text_ids, strict=True) if r.status is Status.RUNNING]
            launched = self._launch(decode, texts)
        launch_ms = (time.perf_counter() - started) * 1000
        if plan.prefill:
            prefill_started, prefill_cpu_started = time.perf_counter(), time.thread_time()
            self.stats.prefills += self._prefill(plan.prefill)
            self.stats.prefill_ms_total += (time.perf_counter() - prefill_started) * 1000
            self.stats.prefill_cpu_ms_total += (time.thread_time() - prefill_cpu_started) * 1000
        # Read the previous step while the GPU runs this one. (Set only now: a failing prefill leaves the previous
        # step in flight for _fail_running, and this step's requests are all running.)
        collect_started = time.perf_counter()
        collected, self._in_flight = self._in_flight, launched
        if collected is not None:
            self._collect(*collected)
        if launched is not None:
            elapsed_ms = launch_ms + (time.perf_counter() - collect_started) * 1000
            self.stats.steps += 1
            self.stats.rows_computed += launched[0].num_rows
            self.stats.last_step_ms = elapsed_ms
            self.stats.step_ms_total += elapsed_ms
            self.stats.last_batch_size = len(decode)
        return bool(plan.prefill or launched or collected)

    def run_until_idle(self, max_steps: int = 100_000) -> None:
        """Step until no request can advance (tests, benchmarks; without the thread)."""
        for _ in range(max_steps):
            if not self.step() and not self._commands:
                return

    def _fail_running(self, error: Exception) -> None:
        """A step raised (device error, out of memory): end every running request with an error, and every request
        preempted in that step whose last frame was still on the device (`_collect` would have queued it again)."""
        in_flight, self._in_flight = self._in_flight, None
        stranded = [
            request
            for request in (in_flight[1] if in_flight else [])
            if request.status is Status.WAITING and request not in self.scheduler.waiting
        ]
        for request in [*self.scheduler.running.values(), *stranded]:
            self._finish(request, FinishReason.ERROR, f"talker step failed: {type(error).__name__}: {error}")

    def _apply_commands(self) -> None:
        while self._commands:
            kind, request_id, payload = self._commands.popleft()
            if kind == "embed":  # belongs to no request
                self._embed_speaker(*payload)
                continue
            entry = self._requests.get(request_id)
            if entry is None:
                continue
            request, _ = entry
            if kind == "add":
                self.scheduler.add(request)
            elif kind == "consumed":
                request.buffered_frames -= payload
            elif kind == "abort":
                self._finish(request, FinishReason.CANCELLED)
            elif kind == "text" and not request.voice.text_complete:
                request.voice.text_ids.extend(payload)
                if request.prompt is not None and request.prompt.streams_text:
                    request.prompt.trailing_text_ids.extend(payload)
            elif kind == "end_text" and not request.voice.text_complete:
                request.voice.text_complete = True
                if request.prompt is not None and request.prompt.streams_text:
                    request.prompt.trailing_text_ids.append(self.model_config.text_ids.tts_eos)
                    request.prompt.streams_text = False
                elif request.status is Status.WAITING and not request.voice.text_ids:
                    self._finish(request, FinishReason.ERROR, "text: no text arrived before end_of_input")

    def _embed_speaker(self, audio: torch.Tensor, future: concurrent.futures.Future) -> None:
        if not future.set_running_or_notify_cancel():  # its caller is gone
            return
        try:
            future.set_result(self.runner.speaker_vector(audio).float().cpu())
        except Exception as error:
            future.set_exception(error)

    def _prefill(self, requests: list[TalkerRequest]) -> int:
        """Build each request's prompt, then run every valid one that gets its KV blocks into its slot: in one
        batched forward, but for prompts longer than the largest padded bucket. Returns how many ran."""
        ready = []
        for request in requests:
            stream = self._requests[request.request_id][1]
            stream.scheduled_at, stream.scheduled_step = time.perf_counter(), self._num_step_calls
            try:
                voice = request.voice
                if voice.mode == "voice_clone" and voice.speaker_vector is None:
                    voice.speaker_vector = self.runner.speaker_vector(voice.ref_audio)
                request.prompt = build_prompt(self.model_config, voice)
                request.num_prompt_positions = request.prompt.num_positions - voice.num_prefix_frames
                self._check_positions(request.num_prompt_positions, voice.num_prefix_frames)
                ready.append(request)
            except PromptError as error:
                self._finish(request, FinishReason.ERROR, str(error))
        ready = [request for request in ready if self._reserve_prompt_blocks(request)]
        # Prompts that fit the largest padded bucket share one forward; a longer one (a request resumed deep into its
        # audio) runs alone, so the others are not padded to its length.
        short = [request for request in ready if request.prompt.num_positions <= LENGTH_BUCKETS[-1]]
        # Plain prompts (most) prefill from their ids in one replay (`PlainPrefill`), the others from embeddings;
        # each kind in batches of like lengths, so that short prompts are not padded to a long one's bucket.
        batches = []
        for is_plain in (True, False):
            kind = [request for request in short if request.prompt.plain is is_plain]
            batches += [[kind[index] for index in batch] for batch in self._batches_by_length(kind)]
        for batch in batches + [[request] for request in ready if request not in short]:
            self._prefill_batch(batch)
        # A resumed request's prefill sampled what the decode step of its last prefix frame sampled: the same stop
        # rule applies (EOS, or its limits reached), which needs that id on the host now — one wait for the device.
        resumed = [request for request in ready if request.num_frames]
        if resumed:
            for request, code0 in zip(resumed, self.runner.next_code0s([r.slot for r in resumed]), strict=True):
                self._may_finish(request, code0)
        return len(ready)

    def _reserve_decode_blocks(self, decode: list[TalkerRequest]) -> None:
        """The KV block of the position each advancing request writes next, oldest first; while the pool has none
        free, the newest request holding blocks is preempted (`decode` may lose some, which step() drops). The
        pool holds at least one whole request, so the oldest always gets its block."""
        held_positions = self.kv_blocks.held * BLOCK_SIZE
        growing = [request for request in decode if held_positions[request.slot] <= request.position]
        for request in sorted(growing, key=lambda r: r.arrival):
            while request.status is Status.RUNNING and not self.kv_blocks.grow(request.slot, request.position + 1):
                holders = [r for r in self.scheduler.running.values() if self.kv_blocks.held[r.slot]]
                self._preempt(max(holders, key=lambda r: r.arrival))

    def _has_room(self, request: TalkerRequest) -> bool:
        """Whether the KV pool can take a waiting request's prompt (its size as last built; one block before) and
        still leave a block per running request, which each may need within its next 64 frames: starting it then
        does not at once preempt another, or itself again if it was preempted (it waits first in the queue)."""
        return self.kv_blocks.num_free - request.prompt_blocks >= self.kv_blocks.num_holders  # holders all run

    def _reserve_prompt_blocks(self, request: TalkerRequest) -> bool:
        """The KV blocks of a request's prompt, or back to the queue's head, its size noted, if the pool lacks
        them (a prompt longer than the last built, or grown by streaming text)."""
        num_positions = request.prompt.num_positions
        request.prompt_blocks = blocks_for(num_positions)
        if self._has_room(request) and self.kv_blocks.grow(request.slot, num_positions):
            return True
        self.scheduler.preempt(request)
        self.scheduler.requeue(request)
        return False

    def _preempt(self, request: TalkerRequest) -> None:
        """Free a running request's slot and KV blocks; it goes back to the queue's head and, prefilled again with
        its frames so far (counter-based draws make the continuation exact), resumes where it stopped."""
        self.stats.preemptions += 1
        _log.info("preempted %s at frame %d: KV cache full", request.request_id, request.num_frames)
        self.kv_blocks.release(request.slot)
        self.scheduler.preempt(request)
        if request.num_launched == request.num_frames:
            self._requeue_preempted(request)
        # else its last frame is still on the device: `_collect` requeues it once that frame is out

    def _requeue_preempted(self, request: TalkerRequest) -> None:
        if request.frame_log:
            frames = np.frombuffer(request.frame_log, dtype=np.int16).reshape(-1, self.model_config.num_code_groups)
            request.voice.prefix_frames = torch.from_numpy(frames.astype(np.int64))
        self.scheduler.requeue(request)

    def _batches_by_length(self, requests: list[TalkerRequest]) -> list[list[int]]:
        """Indices of `requests` in prefill batches (`PaddedPrefill.batches`); one batch without a padded prefill."""
        if not requests:
            return []
        if self.runner.padded_prefill is None:
            return [list(range(len(requests)))]
        return self.runner.padded_prefill.batches([request.prompt.num_positions for request in requests])

    def _prefill_batch(self, requests: list[TalkerRequest]) -> None:
        slots = [request.slot for request in requests]
        samplings, seeds = [r.sampling for r in requests], [r.seed for r in requests]
        self.runner.set_params(slots, samplings, seeds, [r.ignore_eos for r in requests])
        plain, prompts = self.runner.plain_prefill, [r.prompt for r in requests]
        longest = max(prompt.num_positions for prompt in prompts)
        if plain is not None and all(prompt.plain for prompt in prompts) and plain.fits(len(prompts), longest):
            plain.run(slots, prompts)
            return
        embeds, lengths = self.runner.embed_prompts(prompts, [r.voice for r in requests])
        prefix_code0s = [None if r.voice.prefix_frames is None else r.voice.prefix_frames[:, 0] for r in requests]
        self.runner.prefill(slots, embeds, lengths, prefix_code0s)

    def _check_positions(self, num_prompt_positions: int, num_prefix_frames: int) -> None:
        """The prompt must leave room for a frame; a resumed one must hold its prefix frames."""
        limit = self.config.max_positions
        if num_prefix_frames == 0 and num_prompt_positions >= limit:
            raise PromptError(f"text: prompt of {num_prompt_positions} positions exceeds the limit of {limit - 1}")
        if num_prompt_positions + num_prefix_frames > limit:
            raise PromptError(
                f"prefix_frames: the prompt's {num_prompt_positions} positions plus {num_prefix_frames} frames "
                f"exceed max_positions ({limit})"
            )

    def _launch(self, requests: list[TalkerRequest], text_ids: list[int]) -> tuple[DecodeLaunch, list[TalkerRequest]]:
        launch = self.runner.launch([r.slot for r in requests], text_ids, max(r.position for r in requests))
        for request in requests:
            request.num_launched += 1
        return launch, requests

    def _collect(self, launch: DecodeLaunch, requests: list[TalkerRequest]) -> None:
        """Hand out a launched step's frames as soon as they exist (before the step's talker half is done), then
        apply the stop rule with the next codebook-0 ids. A request that finished meanwhile (EOS in the step before,
        cancel) had one frame launched too many: it is dropped, and its slot's state is reset by the next prefill."""
        frames = self.runner.collect_frames(launch).astype(np.int16)
        live = [(index, request) for index, request in enumerate(requests) if request.status is not Status.FINISHED]
        for index, request in live:
            _, stream = self._requests[request.request_id]
            if stream.first_frame_at is None:
                stream.steps_to_first_frame = self._num_step_calls - stream.scheduled_step
            stream.push(frames[index])
            request.frame_log += frames[index].tobytes()
            request.num_frames += 1
            request.buffered_frames += 1
        next_code0 = self.runner.collect_code0(launch)
        for index, request in live:
            self._may_finish(request, next_code0[index])
            if request.status is Status.WAITING:  # preempted while this frame was on the device
                self._requeue_preempted(request)
        self.stats.frames += len(requests)

    def _may_finish(self, request: TalkerRequest, next_code0: int) -> None:
        """The stop rule once frame `num_frames - 1` is out, given the codebook-0 id sampled for the next frame."""
        if next_code0 == self.model_config.codec_ids.eos and not request.ignore_eos:
            self._finish(request, FinishReason.EOS)
        elif request.num_frames >= request.max_frames or (
            request.num_prompt_positions + request.num_frames >= self.config.max_positions
        ):
            self._finish(request, FinishReason.MAX_LENGTH)

    def _finish(self, request: TalkerRequest, reason: FinishReason, error: str | None = None) -> None:
        if request.status is Status.FINISHED:
            return
        if request.status is Status.RUNNING:
            self.kv_blocks.release(request.slot)
        self.scheduler.finish(request)
        request.finish_reason, request.error = reason, error
        _, stream = self._requests.pop(request.request_id)
        stream.num_text_tokens = len(request.voice.text_ids)
        stream.finish(reason, error)
        with self._admit_lock:
            self._admitted -= 1
