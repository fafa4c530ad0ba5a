#!/usr/bin/env bash
# Issue 18 and 20's GPU figures, one stage per call of the device tool (each stage ends well inside its 10-minute
# limit). Run from a clean copy of the commit you quote; every result lands in OUT (JSON + PNG, commit recorded).
#
# Prepare here once:   ../shared/tools/device-wheels.sh               (wheels the GPU image lacks, into .whl)
#                      bench/peers/make_env.sh --wheels .whl-peers   (the peers' wheels, for `peers`: two sets,
#                      bench/peers/make_env.sh --hf4 --wheels .whl-peers-hf4   the batch peer's on transformers 4)
#                      mkdir -p shared/tools && cp -r ../shared/tools/baselines shared/tools/   (reference loops;
#                      a shared/ folder in the checkout travels to the device)
# Then on the device:  CHORUS_COMMIT=<commit> bash bench/gpu_wave.sh STAGE "$OUT"   (carry .whl; for `peers`, carry
#                      .whl-peers and .whl-peers-hf4 alone, ~33 MiB: with .whl they exceed the device tool's 64 MiB)
#   tests      the GPU tests first (kernels, graphs, resume, compiled paths; the paged KV cache is new since the
#              last GPU run), then the decode kernels' and KV pool tests, which are not marked gpu
#   engines    talker 0.6B at batch 1/16/64/128/256 against the reference-style loop (1/16/64), 1.7B at 1/64, the
#              vocoder bf16, the diffusion engine (compiled DiT, cuDNN attention) against diffusers' pipeline
#   tts        the speech stack, both transports (or TRANSPORT) at concurrency 1, 16, 64, 256 (125 frames a
#              request), REQUESTS a level if set
#   formats    the speech stack, REST at 64 in pcm, mp3 and opus (item 4 compares them in one run; GATEWAY_WORKERS=4
#              tells what fewer gateway processes cost them), REQUESTS a level if set (default 128: two ramps)
#   formats-ab formats with REQUESTS (default 512) a level, then mp3 and opus again through a second gateway on the
#              same backends and Redis, of WORKERS_B processes (default 4) with ENCODER_THREADS_B encoder threads each
#              (default 4; the shape before 16 single-thread workers): the gateway's shapes compared on one machine
#   gateways-ab the speech levels (TTS_LEVELS, default 64,256; TRANSPORT, default rest; REQUESTS a level, default 512)
#              through the stack's gateway, then through formats-ab's second gateway (WORKERS_B × ENCODER_THREADS_B,
#              default 4 × 4), ROUNDS times (default 2) alternating, on one stack: whether the gateway's shape moves
#              them; one archive gateways-ab-*.tgz
#   stacks-ab  two speech stacks side by side on the one GPU, one with the settings STACK_A and one with STACK_B (each
#              "VAR=value …", e.g. STACK_B="CHORUS_SPEECH_…=…"; REST 8000 / 8001, each with its own Redis, a KV pool
#              of KV_POSITIONS, default 131072, as both size theirs at once), then the speech levels (TTS_LEVELS,
#              default 64,256; TRANSPORT, default both; REQUESTS a level if set) through A, then B, ROUNDS times
#              (default 3): a setting of the speech process compared on one machine after one start, the other stack
#              idle meanwhile; one archive stacks-ab-*.tgz
#   e2e        tts, then formats' pcm, mp3 and opus, then diffusion, all on one stack (the three stages' figures for one
#              stack start), in one archive e2e-*.tgz
#   sustained  the speech stack, both transports at 64 for 1024 requests (steady quarters and memory per level)
#   long       tts, sustained, formats (pcm, mp3, opus; REQUESTS a level if set) and diffusion on one stack start, in
#              one archive long-*.tgz
#   profile    the speech stack at 64 (pcm, mp3) and 256 (pcm), REST, ~20 s a level (PROFILE_LEVELS), with 10 s of
#              py-spy (needs `../shared/tools/device-wheels.sh py-spy`) on the speech process and one gateway worker
#              mid-level, and on the speech process's GIL holder (`--gil`): profiles-*.tgz holds py-spy's raw stacks
#              per thread, profile-*.txt (a failed attach says why in profile-*.log); `python
#              bench/pyspy_threads.py FILE…` sums them per thread
#   diffusion  the whole stack (`chorus up`), `chorus bench diffusion` at 1, 4, 8
#   peers      faster-qwen3-tts and faster-qwen3-tts-batch in their own site, and our talker engine, on one random
#              0.6B Base checkpoint in the official layout, x-vector voice clones of 125 frames (the peers' times
#              include their codec decode; ours is the talker alone, the `tts` stage times the whole pipeline)
# The speech stack: `chorus serve speech` (talker and vocoder in one process), chorus up's gateway workers (one a
# core, at most 16; GATEWAY_WORKERS sets another number), released shapes
# with dummy weights in bf16, the talker at its CUDA defaults (256 streams sharing a KV pool sized to half the free
# GPU memory) unless TALKER_SLOTS / KV_POSITIONS say otherwise; each stream may still reach the default 4608
# positions (256 × 4608 would take 135 GB at 0.6B; the pool preempts and resumes streams exactly when it runs dry).
set -euo pipefail
stage=${1:?usage: bench/gpu_wave.sh tests|engines|tts|formats|formats-ab|gateways-ab|stacks-ab|e2e|sustained|long|profile|diffusion|peers OUT}
out=${2:?usage: bench/gpu_wave.sh STAGE OUT}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/chorus ]; then  # the GPU image's packages plus the wheels it lacks (the peers stage needs none)
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  fi
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site .
fi
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONSAFEPATH=1
cli=(python3 -c "import sys; from chorus.cli import main; sys.exit(main())")  # pip --target may leave no bin/chorus
chorus() { "${cli[@]}" "$@"; }
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
# -dirty when the tree differs from the commit (the device's copy of the history can be older than its tree).
export CHORUS_COMMIT=${CHORUS_COMMIT:-$(git describe --always --dirty --abbrev=7 --exclude='*' 2>/dev/null || echo unknown)}
label="${device:-CPU}, commit $CHORUS_COMMIT"
logs=$(mktemp -d)

# Each setting may be overridden from the environment (a CPU smoke run of the plumbing: tiny models, TTS_LEVELS=1,2).
export CHORUS_TALKER_MODEL=${CHORUS_TALKER_MODEL:-0.6b} CHORUS_TALKER_LOAD_FORMAT=${CHORUS_TALKER_LOAD_FORMAT:-dummy}
export CHORUS_TALKER_DTYPE=${CHORUS_TALKER_DTYPE:-bfloat16}
export CHORUS_TALKER_MAX_STREAMS=${TALKER_SLOTS:-0} CHORUS_TALKER_KV_CACHE_POSITIONS=${KV_POSITIONS:-0}
export CHORUS_VOCODER_MODEL=${CHORUS_VOCODER_MODEL:-released} CHORUS_VOCODER_LOAD_FORMAT=${CHORUS_VOCODER_LOAD_FORMAT:-dummy}
export CHORUS_VOCODER_DTYPE=${CHORUS_VOCODER_DTYPE:-bfloat16} CHORUS_VOCODER_MAX_STREAMS=${TALKER_SLOTS:-256}
export CHORUS_DIFFUSION_LOAD_FORMAT=${CHORUS_DIFFUSION_LOAD_FORMAT:-dummy}
levels=${TTS_LEVELS:-1,16,64,256}
if [ -n "${GATEWAY_WORKERS:-}" ]; then export CHORUS_GATEWAY_WORKERS=$GATEWAY_WORKERS; fi  # else chorus up's: one a core

start_stack() {  # chorus up [flags]: in the background until this script exits; waits for /ready
  if curl -sf http://127.0.0.1:8000/ready >/dev/null; then
    echo "a stack already answers on port 8000: stop it first (its figures would be taken for this one's)" >&2; exit 1
  fi
  "${cli[@]}" up --timeout-s 420 "$@" >"$logs/up.log" 2>&1 &  # not through the function: $! must be chorus up itself, to stop it
  stack=$!
  # `|| true`: errexit holds in a trap too, and a stack that already ended fails the kill (its log still wanted)
  trap 'kill $stack 2>/dev/null || true; wait $stack 2>/dev/null || true; cp "$logs"/up.log "$out"/ 2>/dev/null || true' EXIT
  for _ in $(seq 420); do
    curl -sf http://127.0.0.1:8000/ready >/dev/null && { echo "stack ready after ${SECONDS} s" >&2; return; }
    kill -0 $stack 2>/dev/null || { tail -50 "$logs/up.log" >&2; exit 1; }
    sleep 1
  done
  echo "stack not ready after 420 s" >&2; tail -50 "$logs/up.log" >&2; exit 1
}

bench_tts() {
  chorus bench tts --fixed-frames 125 --out "$out" --timeout-s 420 "$@"
}

start_gateway_b() {  # a second gateway on 8001/50070: the stack's gateway settings, WORKERS_B × ENCODER_THREADS_B
  local gateway_pid env_b
  gateway_pid=$(pgrep -f "serve gateway" | head -1)  # the stack's gateway supervisor: its environment
  env_b=$(tr '\0' '\n' <"/proc/$gateway_pid/environ" | grep '^CHORUS_GATEWAY_' \
    | grep -v -e _PORT= -e _ENCODER_THREADS= -e _WORKERS=)
  env $env_b CHORUS_GATEWAY_REST_PORT=8001 CHORUS_GATEWAY_PORT=50070 CHORUS_GATEWAY_METRICS_PORT=0 \
    CHORUS_GATEWAY_WORKERS=${WORKERS_B:-4} CHORUS_GATEWAY_ENCODER_THREADS=${ENCODER_THREADS_B:-4} \
    "${cli[@]}" serve gateway >"$logs/gateway-b.log" 2>&1 &
  gateway_b=$!
  trap 'kill $gateway_b $stack 2>/dev/null || true; wait $gateway_b $stack 2>/dev/null || true
    cp "$logs"/*.log "$out"/ 2>/dev/null || true' EXIT
  for _ in $(seq 60); do curl -sf http://127.0.0.1:8001/ready >/dev/null && return; sleep 1; done
  echo "gateway B not ready after 60 s" >&2; tail -20 "$logs/gateway-b.log" >&2; exit 1
}
gateway_b_suffix=", gateway of ${WORKERS_B:-4} workers × ${ENCODER_THREADS_B:-4} encoder threads"
gateway_b_flags=(--url http://127.0.0.1:8001 --grpc-target 127.0.0.1:50070)

bench_formats() {  # FORMATS [flags]: REST at 64 in each format, REQUESTS a level if set, label_suffix if set
  local formats=$1; shift
  for format in $formats; do
    bench_tts --transport rest --concurrency 64 ${REQUESTS:+--requests-per-level $REQUESTS} --format $format \
      --label "$label, $format${label_suffix:-}" "$@"
  done
}

case $stage in
  tests)
    status=0
    # -v: a test's name and outcome once it ends, so a run cut short shows which test was still running (a compiled
    # case compiles for minutes; a bare `...` cut off mid-compile was once read as a failure).
    python3 -m pytest -v --durations=10 -m gpu tests/talker tests/vocoder tests/runtime tests/diffusion \
      --ignore=tests/diffusion/parallel 2>&1 | tee "$out/gpu-tests.log" || status=1
    python3 -m pytest -v tests/talker/test_decode_kernels.py tests/talker/test_kv_blocks.py 2>&1 \
      | tee -a "$out/gpu-tests.log" || status=1
    exit $status
    ;;
  engines)
    python3 -m chorus.talker.bench --size 0.6b --batch-sizes 1,16,64,128,256 --out "$out"
    python3 -m chorus.talker.bench --size 1.7b --batch-sizes 1,64 --skip-reference --out "$out"
    python3 -m chorus.vocoder.bench --precisions bf16 --out "$out"
    python3 -m chorus.diffusion.bench --compile --attention-backend cudnn --out "$out"
    ;;
  tts)
    start_stack --speech-in-one-process
    bench_tts --transport "${TRANSPORT:-both}" --concurrency "$levels" ${REQUESTS:+--requests-per-level $REQUESTS} \
      --label "$label"
    ;;
  formats)
    start_stack --speech-in-one-process
    bench_formats "pcm mp3 opus"
    ;;
  formats-ab)
    start_stack --speech-in-one-process
    REQUESTS=${REQUESTS:-512}
    bench_formats "pcm mp3 opus"
    start_gateway_b
    label_suffix=$gateway_b_suffix bench_formats "mp3 opus" "${gateway_b_flags[@]}"
    ;;
  gateways-ab)
    start_stack --speech-in-one-process
    start_gateway_b
    archive=$out/gateways-ab-$(date +%Y%m%d-%H%M%S).tgz out=$logs/gateways-ab
    mkdir -p "$out"
    for round in $(seq "${ROUNDS:-2}"); do
      for gateway in a b; do
        flags=(--transport "${TRANSPORT:-rest}" --concurrency "${TTS_LEVELS:-64,256}" --requests-per-level "${REQUESTS:-512}")
        if [ $gateway = a ]; then
          bench_tts "${flags[@]}" --label "$label, chorus up's gateway, round $round"
        else
          bench_tts "${flags[@]}" --label "$label$gateway_b_suffix, round $round" "${gateway_b_flags[@]}"
        fi
        cp "$logs"/*.log "$out"/ 2>/dev/null || true
        tar czf "$archive" -C "$out" .  # each level's results (and the stack's logs) as soon as they exist
      done
    done
    ;;
  stacks-ab)
    export CHORUS_TALKER_KV_CACHE_POSITIONS=${KV_POSITIONS:-131072}
    archive=$out/stacks-ab-$(date +%Y%m%d-%H%M%S).tgz out=$logs/stacks-ab
    mkdir -p "$out"
    # Not through a function: $! must be each `chorus up` itself, to stop it (env execs it in place).
    env ${STACK_A:-} "${cli[@]}" up --timeout-s 500 --speech-in-one-process --rest-port 8000 --grpc-port-base 50050 \
      --redis-dir "$logs/redis-a" >"$out/up-a.log" 2>&1 &
    stack_a=$!
    env ${STACK_B:-} "${cli[@]}" up --timeout-s 500 --speech-in-one-process --rest-port 8001 --grpc-port-base 50150 \
      --redis-dir "$logs/redis-b" >"$out/up-b.log" 2>&1 &
    stack_b=$!
    trap 'kill $stack_a $stack_b 2>/dev/null || true; wait $stack_a $stack_b 2>/dev/null || true
      tar czf "$archive" -C "$out" .' EXIT  # also when a stack failed to start: its log
    both_ready() { curl -sf http://127.0.0.1:8000/ready >/dev/null && curl -sf http://127.0.0.1:8001/ready >/dev/null; }
    for _ in $(seq 500); do
      both_ready && break
      if ! kill -0 $stack_a 2>/dev/null || ! kill -0 $stack_b 2>/dev/null; then
        echo "a stack ended before both were ready" >&2; tail -n 20 "$out"/up-*.log >&2; exit 1
      fi
      sleep 1
    done
    both_ready || { echo "the stacks were not both ready after 500 s" >&2; tail -n 20 "$out"/up-*.log >&2; exit 1; }
    echo "both stacks ready after ${SECONDS} s" >&2
    flags=(--transport "${TRANSPORT:-both}" --concurrency "${TTS_LEVELS:-64,256}")
    flags+=(${REQUESTS:+--requests-per-level $REQUESTS})
    for round in $(seq "${ROUNDS:-3}"); do
      bench_tts "${flags[@]}" --label "$label, A (${STACK_A:-as is}), round $round"
      bench_tts "${flags[@]}" --label "$label, B (${STACK_B:-as is}), round $round" \
        --url http://127.0.0.1:8001 --grpc-target 127.0.0.1:50150
      tar czf "$archive" -C "$out" .  # each round's results as soon as they exist
    done
    ;;
  e2e)  # tts, formats and diffusion on one stack: one start (~2 min of device time) instead of three
    start_stack --speech-in-one-process
    archive=$out/e2e-$(date +%Y%m%d-%H%M%S).tgz out=$logs/e2e  # 12 files: one archive (the device tool brings 8)
    mkdir -p "$out"
    set +e  # not `( … ) || status=$?`: inside a tested subshell, set -e does nothing
    (
      set -e
      bench_tts --transport both --concurrency "$levels" --label "$label"
      bench_formats "pcm mp3 opus"
      chorus bench diffusion --out "$out" --label "$label"
    )
    status=$?
    set -e
    cp "$logs/up.log" "$out/"
    tar czf "$archive" -C "$out" .  # whatever ran, also when a bench failed
    exit $status
    ;;
  sustained)
    start_stack --speech-in-one-process
    bench_tts --transport both --concurrency 64 --requests-per-level 1024 --label "$label, sustained"
    ;;
  long)  # tts, sustained, formats' pcm, mp3 and opus, then diffusion, on one stack (a stack start is 3–4 min)
    start_stack --speech-in-one-process
    archive=$out/long-$(date +%Y%m%d-%H%M%S).tgz out=$logs/long
    mkdir -p "$out"
    set +e
    (
      set -e
      bench_tts --transport both --concurrency "$levels" --label "$label"
      tar czf "$archive" -C "$out" .  # each bench's results as soon as they exist: a call cut short keeps them
      bench_tts --transport both --concurrency 64 --requests-per-level 1024 --label "$label, sustained"
      tar czf "$archive" -C "$out" .
      bench_formats "pcm mp3 opus"
      tar czf "$archive" -C "$out" .
      chorus bench diffusion --out "$out" --label "$label"
    )
    status=$?
    set -e
    cp "$logs/up.log" "$out/"
    tar czf "$archive" -C "$out" .
    exit $status
    ;;
  profile)
    start_stack --speech-in-one-process
    IFS=, read -ra profile_levels <<<"${PROFILE_LEVELS:-64 pcm 768,64 mp3 768,256 pcm 1536}"
    for level in "${profile_levels[@]}"; do  # concurrency, format, requests (enough for ~20 s on an H100)
      set -- $level
      bench_tts --transport rest --concurrency $1 --requests-per-level $3 --format $2 --label "$label, profile" &
      jobs_of_level=($!)
      sleep "${PROFILE_AFTER_S:-8}"  # past the level's first burst of prefills
      # Three samplings: the speech process's running threads, one gateway worker's, and which thread of the speech
      # process holds the GIL. The speech server is the oldest "serve speech" process: once the newest was another
      # one, with the server's thread names and every thread idle through a 256-stream level.
      speech=$(pgrep -o -f "serve speech")
      for sampling in "$speech speech" "$(pgrep -n -f "serve gateway") gateway" "$speech speech-gil --gil"; do
        set -- $level $sampling  # concurrency, format, requests, pid, name, py-spy option
        name=profile-$5-c$1-$2
        py-spy record --pid "$4" --duration 10 --rate 200 --nonblocking --threads ${6:-} \
          --format raw --output "$logs/$name.txt" >"$logs/$name.log" 2>&1 &
        jobs_of_level+=($!)
      done
      wait "${jobs_of_level[@]}"  # not the stack, which runs on
    done
    # One archive: the device tool brings back at most 8 files from a call.
    tar czf "$out/profiles-$(date +%Y%m%d-%H%M%S).tgz" -C "$logs" $(cd "$logs" && ls profile-*)
    ;;
  diffusion)
    start_stack
    chorus bench diffusion --out "$out" --label "$label"
    ;;
  peers)
    # Two sites: faster-qwen3-tts on transformers 5.16.1, the batch peer on transformers 4.57.3 (bench/peers/README.md).
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/peers-site .whl-peers/*.whl
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/peers-hf4-site \
      .whl-peers-hf4/*.whl
    python3 bench/peers/write_checkpoint.py /tmp/ck-0.6b --size 0.6b
    python3 -m chorus.talker.bench --size /tmp/ck-0.6b --voice-clone --batch-sizes 1,16,64 --skip-reference --out "$out"
    for peer in faster-qwen3-tts faster-qwen3-tts-batch; do  # a peer that cannot run says why, in its JSON
      # The batch peer's likely best size first (an H100 timed 64 and 1 within 125 s); a timeout keeps sizes timed.
      site=/tmp/peers-site; [ $peer = faster-qwen3-tts-batch ] && site=/tmp/peers-hf4-site
      python3 bench/peers/run_peer.py $peer --checkpoint /tmp/ck-0.6b --python python3 --pythonpath $site \
        --batch-sizes 64,1,16,32,4 --out "$out" --log "$out/$peer.log" --timeout-s 180 || true
    done
    ;;
  *)
    echo "unknown stage $stage" >&2; exit 2
    ;;
esac
