# syntax=docker/dockerfile:1
# Chorus, CPU image: every process (`chorus serve talker|vocoder|diffusion|gateway`) on CPU torch.
# For laptops, CI and the gateway in production. GPU services use Dockerfile.cuda.
#
#   docker build -t chorus:cpu .
#   docker run --rm -p 8000:8000 chorus:cpu serve gateway
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS runtime

# Same pin as the Makefile's CPU install; the CPU index keeps several GB of CUDA wheels out.
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/chorus/venv \
    PATH=/opt/chorus/venv/bin:$PATH

RUN python -m venv "$VIRTUAL_ENV"
# torch first, in its own layer: it is the largest download and changes least often.
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install "$TORCH_SPEC" --index-url "$TORCH_INDEX_URL"

# Editable on purpose: pyproject maps services/* and gateway/ into the `chorus` namespace but lists
# only the top-level packages, so a regular wheel would miss subpackages such as chorus.vocoder.models
# (and any non-Python files); the editable finder serves everything under the mapped folders.
WORKDIR /opt/chorus/src
COPY pyproject.toml README.md ./
COPY chorus ./chorus
COPY services ./services
COPY gateway ./gateway
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -e . \
    && python -m compileall -q chorus services gateway

# Its `#!/usr/bin/env python3` finds the venv's python through PATH.
COPY --chmod=0755 deploy/docker/grpc_health_probe.py /usr/local/bin/chorus-health-probe

# Containers bind 0.0.0.0 on fixed ports (the config default, port 0, picks a random one);
# every process serves Prometheus metrics on 9090; models and the HF cache live on /models; torch.compile's and
# Triton's kernel caches on /var/cache/chorus, as in the CUDA image (nothing is compiled on CPU).
ENV CHORUS_TALKER_HOST=0.0.0.0 CHORUS_TALKER_PORT=50051 CHORUS_TALKER_METRICS_PORT=9090 \
    CHORUS_VOCODER_HOST=0.0.0.0 CHORUS_VOCODER_PORT=50052 CHORUS_VOCODER_METRICS_PORT=9090 \
    CHORUS_DIFFUSION_HOST=0.0.0.0 CHORUS_DIFFUSION_PORT=50053 CHORUS_DIFFUSION_METRICS_PORT=9090 \
    CHORUS_GATEWAY_HOST=0.0.0.0 CHORUS_GATEWAY_PORT=50050 CHORUS_GATEWAY_METRICS_PORT=9090 \
    CHORUS_GATEWAY_REST_HOST=0.0.0.0 CHORUS_GATEWAY_REST_PORT=8000 \
    CHORUS_PROBE_ADDRESS=127.0.0.1:50050 \
    HF_HOME=/models/huggingface \
    TORCHINDUCTOR_CACHE_DIR=/var/cache/chorus/inductor TRITON_CACHE_DIR=/var/cache/chorus/triton

RUN useradd --system --uid 10001 --home-dir /home/chorus --create-home chorus \
    && mkdir -p /models /var/cache/chorus && chown chorus:chorus /models /var/cache/chorus
USER 10001
WORKDIR /home/chorus
VOLUME ["/models", "/var/cache/chorus"]
EXPOSE 8000 50050 50051 50052 50053 9090

# Probes the port in CHORUS_PROBE_ADDRESS (the gateway's by default); set it per container.
# start-period covers model loading and warm-up, during which the service reports NOT_SERVING;
# --start-interval needs Docker Engine 25 or newer.
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --start-interval=2s --retries=3 \
    CMD ["chorus-health-probe"]

# Python is PID 1 and installs its own SIGTERM handler: drain within grace_s, then exit 0.
ENTRYPOINT ["chorus"]
CMD ["serve", "gateway"]
