"""Request records: one Redis hash per request, with a TTL and atomic status transitions.

Status moves queued → running → done | failed | cancelled (queued may also go straight to
cancelled or failed). Each move is one Lua script that checks the current status, so of two
gateway replicas racing to move a request only one wins; the other sees `False`.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid

import redis.asyncio as redis

from chorus.gateway.state import keys
from chorus.gateway.state.connection import redis_guard
from chorus.runtime.errors import ChorusError, NotFound

QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
TERMINAL = (DONE, FAILED, CANCELLED)
_NEXT = {QUEUED: (RUNNING, FAILED, CANCELLED), RUNNING: (DONE, FAILED, CANCELLED)}
# A request that failed with one of these (its error's gRPC code) failed on the server's side: a retry with its
# idempotency key runs again instead of being answered the failure (a 5xx invites the retry the key is for).
RETRYABLE_FAILURES = ("UNAVAILABLE", "INTERNAL", "UNKNOWN", "DEADLINE_EXCEEDED", "ABORTED", "RESOURCE_EXHAUSTED")

# KEYS[1] record. ARGV: new status, ttl_s, timestamp field (or ""), now_s, runner ("" = any), n allowed current
# statuses, those n statuses, then field/value pairs written with the move.
# Returns {moved 0/1, status before}; {-1, ''} without a record, {-2, ''} when another runner owns it.
_TRANSITION = """
local current = redis.call('HGET', KEYS[1], 'status')
if not current then return {-1, ''} end
if ARGV[5] ~= '' and redis.call('HGET', KEYS[1], 'runner') ~= ARGV[5] then return {-2, ''} end
local num_from = tonumber(ARGV[6])
for i = 7, 6 + num_from do
  if current == ARGV[i] then
    redis.call('HSET', KEYS[1], 'status', ARGV[1])
    if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], ARGV[3], ARGV[4]) end
    for j = 7 + num_from, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[j], ARGV[j + 1]) end
    redis.call('EXPIRE', KEYS[1], ARGV[2])
    return {1, current}
  end
end
return {0, current}
"""

# KEYS[1] record. ARGV[1]: runner. Makes ARGV[1] the runner of a request that has not ended; returns its status
# (nil without a record).
_TAKE = """
local current = redis.call('HGET', KEYS[1], 'status')
if not current then return false end
if current == 'queued' or current == 'running' then redis.call('HSET', KEYS[1], 'runner', ARGV[1]) end
return current
"""

# KEYS[1] idempotency key, KEYS[2] the record of the request it names. ARGV[1]: that request's id, then the error
# codes of failures a retry should run again. Deletes the key if it still names that request and the request is
# gone (expired), failed with one of those codes, or was cancelled because its client went away (a cancel with an
# error; one the client asked for has none); returns 1 if it did.
_RELEASE_KEY = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then
  local status = redis.call('HGET', KEYS[2], 'status')
  local error = redis.call('HGET', KEYS[2], 'error')
  local is_retryable = status == 'cancelled' and error
  if status == 'failed' then
    local code = cjson.decode(error or '{}').code
    for i = 2, #ARGV do if code == ARGV[i] then is_retryable = true end end
  end
  if not is_retryable then return 0 end
end
redis.call('DEL', KEYS[1])
return 1
"""

# KEYS[1] record. Marks the cancel flag; a queued request is cancelled on the spot (nobody runs it
# yet), a running one is left to the replica running it. Returns the status after the call.
_CANCEL = """
local current = redis.call('HGET', KEYS[1], 'status')
if not current then return false end
if current == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finished_at_s', ARGV[1], 'is_cancel_requested', '1')
  return 'cancelled'
end
if current == 'running' then redis.call('HSET', KEYS[1], 'is_cancel_requested', '1') end
return current
"""


@dataclasses.dataclass(frozen=True, slots=True)
class RequestRecord:
    request_id: str
    kind: str  # "speech" or "audio"
    status: str
    model: str
    voice: str
    owner: str
    created_at_s: float
    started_at_s: float | None = None
    finished_at_s: float | None = None
    usage: dict | None = None
    error: dict | None = None
    last_sequence: int | None = None
    is_cancel_requested: bool = False
    response_format: str = ""
    progress: dict | None = None  # {"step", "num_steps"} of a text-to-audio run
    timeline: dict | None = None  # stage → wall-clock time, of runs that mark their stages (text-to-audio)

    @classmethod
    def from_hash(cls, fields: dict[bytes, bytes]) -> RequestRecord:
        text = {k.decode(): v.decode() for k, v in fields.items()}

        def number(name: str) -> float | None:
            return float(text[name]) if name in text else None

        return cls(
            request_id=text["request_id"],
            kind=text["kind"],
            status=text["status"],
            model=text["model"],
            voice=text["voice"],
            owner=text["owner"],
            created_at_s=float(text["created_at_s"]),
            started_at_s=number("started_at_s"),
            finished_at_s=number("finished_at_s"),
            usage=json.loads(text["usage"]) if "usage" in text else None,
            error=json.loads(text["error"]) if "error" in text else None,
            last_sequence=int(text["last_sequence"]) if "last_sequence" in text else None,
            is_cancel_requested=text.get("is_cancel_requested") == "1",
            response_format=text.get("response_format", ""),
            progress=json.loads(text["progress"]) if "progress" in text else None,
            timeline=json.loads(text["timeline"]) if "timeline" in text else None,
        )

    def timeline_ms(self) -> dict[str, float] | None:
        """Milliseconds from admission to each stage the run marked, in time order, between `started` and
        `finished` (None for runs that mark none); `arrived`, when the request reached the gateway, comes first,
        negative (its wait for admission). Stamps are wall-clock: a run taken over by a process on another host adds
        that host's clock offset to its stages, and a stage a backend stamped (`talker_received`, `talker_admitted`)
        its host's."""
        if self.timeline is None:
            return None
        stages = dict(self.timeline)
        arrived = {"arrived": stages.pop("arrived")} if "arrived" in stages else {}
        stamps = {**arrived, "admitted": self.created_at_s, "started": self.started_at_s, **stages}
        stamps["finished"] = self.finished_at_s
        since_admission = {stage: at_s - self.created_at_s for stage, at_s in stamps.items() if at_s is not None}
        in_order = sorted(since_admission.items(), key=lambda item: item[1])  # stable: ties keep the order reached
        return {f"{stage}_ms": round(elapsed_s * 1000, 1) for stage, elapsed_s in in_order}


class RunLost(ChorusError):
    """Another gateway process took this run over (this one was presumed dead): stop without a trace."""


class RequestStore:
    def __init__(self, client: redis.Redis, ttl_s: int = 3600) -> None:
        self.client = client
        self.ttl_s = ttl_s
        self._transition = client.register_script(_TRANSITION)
        self._cancel = client.register_script(_CANCEL)
        self._take = client.register_script(_TAKE)
        self._release_key = client.register_script(_RELEASE_KEY)

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    def new_record(
        self,
        kind: str,
        model: str,
        voice: str = "",
        owner: str = "",
        response_format: str = "",
        request_id: str | None = None,
        runner: str = "",
    ) -> tuple[RequestRecord, dict[str, str]]:
        """A queued record and the hash fields that store it."""
        record = RequestRecord(
            request_id=request_id or self.new_id(),
            kind=kind,
            status=QUEUED,
            model=model,
            voice=voice,
            owner=owner,
            created_at_s=time.time(),
            response_format=response_format,
        )
        names = ("request_id", "kind", "status", "model", "voice", "owner", "response_format")
        fields = {name: getattr(record, name) for name in names} | {"created_at_s": repr(record.created_at_s)}
        if runner:
            fields["runner"] = runner
        return record, fields

    async def create(self, kind: str, model: str, **named: str) -> RequestRecord:
        """Stores a new queued record (requests that run are created with their run: `RunQueue.admit`)."""
        record, fields = self.new_record(kind, model, **named)
        key = keys.record(record.request_id)
        with redis_guard("creating a request"):
            async with self.client.pipeline(transaction=True) as pipe:
                await pipe.hset(key, mapping=fields).expire(key, self.ttl_s).execute()
        return record

    async def get(self, request_id: str) -> RequestRecord:
        with redis_guard("reading a request"):
            fields = await self.client.hgetall(keys.record(request_id))
        if not fields:
            raise NotFound(f"request {request_id!r} not found (unknown or expired)")
        return RequestRecord.from_hash(fields)

    async def transition(self, request_id: str, status: str, runner: str = "", **fields: object) -> bool:
        """Moves the request to `status` if its current status allows it; False if another move won.

        `fields` (usage, error: dicts; last_sequence: int) are written in the same atomic step. With `runner`,
        only while that runner owns the request (else `RunLost`).
        """
        allowed_from = [before for before, after in _NEXT.items() if status in after]
        assert allowed_from, f"no transition leads to {status!r}"
        timestamp_field = "started_at_s" if status == RUNNING else "finished_at_s"
        pairs = []
        for name, value in fields.items():
            pairs += [name, json.dumps(value) if isinstance(value, dict) else str(value)]
        args = [status, self.ttl_s, timestamp_field, repr(time.time()), runner, len(allowed_from), *allowed_from]
        with redis_guard("updating a request"):
            moved, _ = await self._transition(keys=[keys.record(request_id)], args=[*args, *pairs])
        if moved == -1:
            raise NotFound(f"request {request_id!r} not found (unknown or expired)")
        if moved == -2:
            raise RunLost(f"request {request_id!r} is run by another gateway process now")
        return moved == 1

    async def set_progress(self, request_id: str, step: int, num_steps: int, restarts: int = 0) -> None:
        """Records how far a multi-step run is (read by status and progress-event readers); `restarts`: times
        it started again from step 0 on another replica."""
        progress = {"step": step, "num_steps": num_steps} | ({"restarts": restarts} if restarts else {})
        with redis_guard("recording progress"):
            await self.client.hset(keys.record(request_id), "progress", json.dumps(progress))

    async def take(self, request_id: str, runner: str) -> str | None:
        """Makes `runner` the one running the request, unless it ended; its status (None: expired)."""
        with redis_guard("taking a run over"):
            status = await self._take(keys=[keys.record(request_id)], args=[runner])
        return status.decode() if status is not None else None

    async def request_cancel(self, request_id: str) -> str:
        """Asks for the request to stop, wherever it runs; returns its status after the call."""
        with redis_guard("cancelling a request"):
            status = await self._cancel(keys=[keys.record(request_id)], args=[repr(time.time())])
            if status is None:
                raise NotFound(f"request {request_id!r} not found (unknown or expired)")
            # Pub/sub is only a hint (lost if nobody listens); the flag in the record is authoritative.
            await self.client.publish(keys.cancel_channel(request_id), b"cancel")
        return status.decode()

    async def is_cancel_requested(self, request_id: str) -> bool:
        with redis_guard("reading a cancel flag"):
            return await self.client.hget(keys.record(request_id), "is_cancel_requested") == b"1"

    async def idempotent_request(self, owner: str, key: str) -> str | None:
        """The id of the request `key` was used for, if a retry with it should get that request (a cheap look
        before admission). A key whose request expired, failed on the server's side (`RETRYABLE_FAILURES`) or was
        cancelled because its client went away is released instead, and None returned: the retry runs as a new
        request and claims the key again."""
        idempotency = keys.idempotency(owner, key)
        with redis_guard("checking an idempotency key"):
            existing = await self.client.get(idempotency)
            if existing is None:
                return None
            request_id = existing.decode()
            args = [request_id, *RETRYABLE_FAILURES]
            is_released = await self._release_key(keys=[idempotency, keys.record(request_id)], args=args)
        return None if is_released else request_id
