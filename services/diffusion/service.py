"""The diffusion process: gRPC glue between `Diffusion.Generate` and the diffusion engine."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from chorus.diffusion import metrics
from chorus.diffusion.config import DiffusionConfig
from chorus.diffusion.engine.engine import DiffusionEngine, StepStats
from chorus.diffusion.engine.request import Finished, FinishReason, validate_request
from chorus.diffusion.loader import load_models
from chorus.diffusion.parallel.group import ParallelGroup, rank_device
from chorus.diffusion.wire import generation_request, output_messages
from chorus.runtime.errors import Unavailable
from chorus.runtime.heap import keep_large_buffers_mapped
from chorus.runtime.host import Service
from chorus.runtime.logs import request_id_var
from chorus.v1 import common_pb2, diffusion_pb2_grpc

logger = logging.getLogger(__name__)

# Steps of the start-up generation: a first, a second-order and a last step are all the sampler does
# differently, and the DiT's graphs are captured already, so more steps would only add start-up time.
WARMUP_NUM_STEPS = 3


class DiffusionServicer(diffusion_pb2_grpc.DiffusionServicer):
    def __init__(self, service: DiffusionService) -> None:
        self.service = service

    async def Generate(self, request, context):
        engine = self.service.require_engine()
        request.request_id = request.request_id or request_id_var.get()
        request_id_var.set(request.request_id)
        remaining_s = context.time_remaining()
        deadline_s = time.monotonic() + remaining_s if remaining_s is not None else None
        generation = generation_request(engine.limits, request, deadline_s)
        async for event in engine.generate(generation):
            for message in output_messages(event):
                yield message

    async def GetLoad(self, request, context):
        load = self.service.require_engine().load()
        return common_pb2.LoadReport(
            live_streams=load.num_live_requests, free_slots=load.num_free_slots, queue_depth=load.queue_depth
        )


class DiffusionService(Service):
    name = "diffusion"
    grpc_services = ("chorus.v1.Diffusion",)

    def __init__(self, config: DiffusionConfig) -> None:
        self.config = config
        self.engine: DiffusionEngine | None = None
        self.parallel_group: ParallelGroup | None = None

    def require_engine(self) -> DiffusionEngine:
        if self.engine is None:
            raise Unavailable("diffusion is warming up")
        return self.engine

    def register(self, server: grpc.aio.Server) -> None:
        diffusion_pb2_grpc.add_DiffusionServicer_to_server(DiffusionServicer(self), server)

    async def start(self) -> None:
        keep_large_buffers_mapped()  # each output is copied several times on its way out: see chorus.runtime.heap
        # Loading and CUDA-graph capture block: run them off the loop so health answers NOT_SERVING meanwhile.
        engine = await asyncio.to_thread(self._build_engine)
        engine.start()
        await self._warm_up(engine)
        self.engine = engine  # Generate and GetLoad answer Unavailable until here
        metrics.QUEUE_DEPTH.set_function(lambda: self.engine.load().queue_depth)
        metrics.LIVE_REQUESTS.set_function(lambda: self.engine.load().num_live_requests)

    async def _warm_up(self, engine: DiffusionEngine) -> None:
        """Runs one generation at a default request's shapes (prompt with CFG, default duration, so the VAE
        decodes a default request's latent length) with few steps, so that first-call costs (cuDNN autotune,
        lazy CUDA and allocator init, the T5 and VAE first calls, compiled code's first runs) are paid here and
        not by the first client: on an H100 without it, the first request's admission to first step took 584 ms,
        later ones' 39-97 ms. It goes through the engine like a request, so in parallel mode the workers take its
        steps with rank 0 as they do any request's."""
        started_s = time.perf_counter()
        request = validate_request(
            engine.limits, request_id="warm-up", prompt="warm-up", num_steps=WARMUP_NUM_STEPS, seed=0
        )
        async for event in engine.generate(request):
            if isinstance(event, Finished) and event.reason is not FinishReason.COMPLETE:
                raise RuntimeError(f"warm-up generation failed: {event.error_code} {event.error_message}")
        logger.info("warm-up generation took %.2f s", time.perf_counter() - started_s)

    def _record_step(self, stats: StepStats) -> None:
        if self.engine is None:  # a step of the warm-up generation, not of a client's request
            return
        metrics.STEP_SECONDS.observe(stats.step_time_s)
        metrics.BATCH_SIZE.observe(stats.num_samples)

    def _build_engine(self) -> DiffusionEngine:
        config = self.config
        is_parallel = config.parallel != "none"
        device = str(rank_device(config.device, 0)) if is_parallel else config.device
        models = load_models(config.model, config.load_format, device, config.dtype)
        if is_parallel:
            # Rank 0 steps the whole batch through the group, whose ranks own their graphs (see ParallelGroup).
            self.parallel_group = ParallelGroup.launch(config, models)
            return DiffusionEngine(
                models,
                max_batch_size=config.max_batch_size,
                batch_window_ms=config.batch_window_ms,
                max_queue_size=config.max_queue_size,
                default_num_steps=config.default_num_steps,
                default_guidance_scale=config.default_guidance_scale,
                denoiser=self.parallel_group.denoiser,
                on_step=self._record_step,
            )
        return DiffusionEngine(
            models,
            max_batch_size=config.max_batch_size,
            batch_window_ms=config.batch_window_ms,
            max_queue_size=config.max_queue_size,
            default_num_steps=config.default_num_steps,
            default_guidance_scale=config.default_guidance_scale,
            use_cuda_graphs=config.use_cuda_graphs,
            compile_dit=config.compile_dit,
            compile_mode=config.compile_mode,
            attention_backend=config.attention_backend,
            on_step=self._record_step,
        )

    async def close(self) -> None:
        if self.engine is not None:
            await asyncio.to_thread(self.engine.stop)
        if self.parallel_group is not None:
            await asyncio.to_thread(self.parallel_group.close)
            self.parallel_group = None
