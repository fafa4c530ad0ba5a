"""Admission limits that follow what the backends serve: a `*_max_in_flight` of 0 (the speech backends' default).

Each backend replica reports its load after every health check; its live streams plus its free slots are the
streams it serves at once (the talker's decode slots: 256 on CUDA and 64 elsewhere at its defaults; the vocoder's
decode streams). A derived limit is what the healthy replicas of a backend that are not draining serve together,
split evenly between the gateway processes in front of them (`admission_split`; `--workers N` gives each of its
processes N), each taking its share rounded up, so that rounding never leaves the backend idle. It follows the
reports: a replica that starts serving raises it, one that fails or drains lowers it (the requests running finish).
A replica yet to report counts as `UNREPORTED_CAPACITY`, which is also the limit until any replica is healthy.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from chorus.gateway.admission import BackendAdmission
from chorus.gateway.backends import BackendPool, Replica

log = logging.getLogger("chorus.gateway.capacity")
UNREPORTED_CAPACITY = 64  # what the talker serves off CUDA: the limit before the backends have reported


def share_of_capacity(capacity: int, admission_split: int) -> int:
    """One gateway process's admission limit for a backend whose replicas serve `capacity` streams at once."""
    return max(1, -(-capacity // admission_split))


def serving_capacity(replicas: Iterable[Replica]) -> int | None:
    """Streams the healthy replicas that are not draining serve at once; None when no replica is serving."""
    serving = [
        replica
        for replica in replicas
        if replica.is_healthy and not (replica.load is not None and replica.load.is_draining)
    ]
    if not serving:
        return None
    return sum(UNREPORTED_CAPACITY if replica.capacity is None else replica.capacity for replica in serving)


class DerivedLimits:
    """Keeps the admission limits of the backends given in step with their replicas' load reports (`update`, after
    each check of a replica)."""

    def __init__(self, backends: BackendPool, limits: dict[str, BackendAdmission], admission_split: int) -> None:
        self.backends = backends
        self.limits = limits
        self.admission_split = admission_split

    def update(self, kind: str) -> None:
        """After a replica of `kind` was checked: its backend's limit from what its replicas serve now (unchanged
        while none is serving: no request is admitted then)."""
        admission = self.limits.get(kind)
        if admission is None:
            return  # a limit set, not derived
        capacity = serving_capacity(self.backends.replicas[kind])
        if capacity is None:
            return
        limit = share_of_capacity(capacity, self.admission_split)
        if limit != admission.max_in_flight:
            log.info(
                "%s admission limit %d -> %d (its replicas serve %d streams at once, split %d ways)",
                kind, admission.max_in_flight, limit, capacity, self.admission_split,
            )  # fmt: skip
            admission.resize(limit)
