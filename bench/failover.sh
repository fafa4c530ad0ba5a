#!/usr/bin/env bash
# Fail-over under load on one GPU: two talker and two vocoder replicas (each at its share of GPU memory),
# one gateway, every backend replica restarted by a shell loop when it dies (as Kubernetes would restart
# it); then `chorus bench tts --chaos` kills a talker or vocoder replica every CHAOS_S seconds while it
# runs. Usage: bench/failover.sh [bench flags...]   (results: bench/results/e2e-tts-*.json/.png)
set -euo pipefail
CHAOS_S=${CHAOS_S:-15}
LOGS=${LOGS:-$(mktemp -d)}; mkdir -p "$LOGS"
export CHORUS_TALKER_MODEL=${CHORUS_TALKER_MODEL:-0.6b} CHORUS_TALKER_LOAD_FORMAT=${CHORUS_TALKER_LOAD_FORMAT:-dummy}
export CHORUS_TALKER_DTYPE=${CHORUS_TALKER_DTYPE:-bfloat16} CHORUS_TALKER_MAX_STREAMS=${CHORUS_TALKER_MAX_STREAMS:-32}
export CHORUS_TALKER_MAX_POSITIONS=${CHORUS_TALKER_MAX_POSITIONS:-2048}
export CHORUS_VOCODER_MODEL=${CHORUS_VOCODER_MODEL:-released} CHORUS_VOCODER_LOAD_FORMAT=${CHORUS_VOCODER_LOAD_FORMAT:-dummy}
export CHORUS_VOCODER_DTYPE=${CHORUS_VOCODER_DTYPE:-bfloat16} CHORUS_VOCODER_MAX_STREAMS=${CHORUS_VOCODER_MAX_STREAMS:-64}
pids=()
stop_all() {  # the restart loops, then what they had started
  local children
  children=$(for pid in "${pids[@]}"; do pgrep -P "$pid"; done || true)
  kill "${pids[@]}" $children 2>/dev/null || true
}
trap stop_all EXIT
if [ -z "${CHORUS_GATEWAY_REDIS_URL:-}" ]; then  # a local Redis of its own
  "$(python3 -c 'from chorus.runtime.redis_server import redis_server_binary; print(redis_server_binary())')" \
    --port 6390 --save '' --appendonly no --dir "$LOGS" >"$LOGS/redis.log" 2>&1 &
  pids+=($!)
  export CHORUS_GATEWAY_REDIS_URL=redis://127.0.0.1:6390/0
fi

supervised() {  # name port command...: restart the replica whenever it exits
  local name=$1 port=$2; shift 2
  (while true; do "$@" --port "$port" --metrics-port -1 >>"$LOGS/$name.log" 2>&1 || true; echo "$(date +%T) $name exited; restarting" >>"$LOGS/restarts.log"; sleep 0.5; done) &
  pids+=($!)
}
supervised talker-0 50061 python3 -m chorus.cli serve talker
supervised talker-1 50062 python3 -m chorus.cli serve talker
supervised vocoder-0 50063 python3 -m chorus.cli serve vocoder
supervised vocoder-1 50064 python3 -m chorus.cli serve vocoder
CHORUS_GATEWAY_TALKER_TARGETS=127.0.0.1:50061,127.0.0.1:50062 CHORUS_GATEWAY_VOCODER_TARGETS=127.0.0.1:50063,127.0.0.1:50064 \
  CHORUS_GATEWAY_DIFFUSION_TARGETS=127.0.0.1:50065 CHORUS_GATEWAY_WORKERS=${CHORUS_GATEWAY_WORKERS:-4} \
  python3 -m chorus.cli serve gateway --rest-port 8000 --port 50050 >>"$LOGS/gateway.log" 2>&1 &
pids+=($!)
for _ in $(seq 600); do  # every speech replica serving (the diffusion target is absent on purpose)
  body=$(curl -s http://127.0.0.1:8000/ready || true)
  [ "$(echo "$body" | grep -o '"127.0.0.1:5006[1-4]":true' | wc -l)" = 4 ] && break
  sleep 1
done
echo "speech replicas serving after ${SECONDS} s; logs in $LOGS" >&2
python3 -m chorus.cli bench tts --chaos "$CHAOS_S" "$@"
echo "restarts:" >&2; cat "$LOGS/restarts.log" >&2 || true
