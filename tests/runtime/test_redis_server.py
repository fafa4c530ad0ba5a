"""The embedded redis-server keeps an append-only file: what has no TTL (saved voices) survives a restart."""

from __future__ import annotations

import pytest
import redis

from chorus.runtime.redis_server import start_local_redis


def test_keys_survive_a_restart_on_the_same_directory_and_two_servers_never_share_one(tmp_path):
    server = start_local_redis(tmp_path)
    try:
        with redis.Redis.from_url(server.url) as client:
            client.hset("chorus:voice", mapping={"name": "alice"})
        with pytest.raises(RuntimeError, match="keeps its data in"):
            start_local_redis(tmp_path)
    finally:
        server.stop()
    restarted = start_local_redis(tmp_path)
    try:
        with redis.Redis.from_url(restarted.url) as client:
            assert client.hgetall("chorus:voice") == {b"name": b"alice"}
            assert client.config_get("appendonly") == {"appendonly": "yes"}
    finally:
        restarted.stop()
