"""The gateway's Redis URL forms: plain redis:// (redis-py's) and redis+sentinel:// (ours)."""

from __future__ import annotations

import pytest

from chorus.gateway.config import GatewayConfig
from chorus.gateway.state.redis_url import SentinelAddress, check_redis_url, parse_sentinel_url, redacted


def test_sentinel_url_names_sentinels_master_database_and_passwords():
    address = parse_sentinel_url(
        "redis+sentinel://s%40cret@sentinel-0.redis:26380,sentinel-1.redis,[fd00::7]:5000/chorus/3"
        "?sentinel_password=other"
    )
    assert address == SentinelAddress(
        sentinels=(("sentinel-0.redis", 26380), ("sentinel-1.redis", 26379), ("fd00::7", 5000)),
        service_name="chorus",
        db=3,
        password="s@cret",
        sentinel_password="other",
    )
    assert "s@cret" not in repr(address) and "other" not in repr(address)
    with_user = parse_sentinel_url("redis+sentinel://app:pw:with:colons@127.0.0.1:26379/mymaster")
    assert (with_user.username, with_user.password, with_user.db) == ("app", "pw:with:colons", 0)
    assert parse_sentinel_url("redis+sentinel://127.0.0.1/mymaster").password is None


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://127.0.0.1:26379", "/service_name"),
        ("redis+sentinel://127.0.0.1:26379/", "/service_name"),
        ("redis+sentinel://127.0.0.1:26379/m/0/extra", "/service_name"),
        ("redis+sentinel://127.0.0.1:26379/m/zero", "database must be a number"),
        ("redis+sentinel://127.0.0.1:port/m", "bad Sentinel port 'port'"),
        ("redis+sentinel://127.0.0.1:70000/m", "bad Sentinel port '70000'"),
        ("redis+sentinel://a:1,,b:2/m", "no host"),
        ("redis+sentinel://127.0.0.1/m?ssl=true", "unknown option ssl"),
        ("http://127.0.0.1:6379/0", "expected a URL starting with redis://"),
        ("127.0.0.1:6379", "expected a URL starting with redis://"),
    ],
)
def test_bad_urls_are_refused_at_startup_saying_why(url, message):
    with pytest.raises(ValueError, match=message):
        check_redis_url(url)
    with pytest.raises(ValueError, match=message):
        GatewayConfig(redis_url=url)


def test_plain_urls_are_left_to_redis_py():
    for url in ("redis://127.0.0.1:6379/0", "rediss://:pw@cache.example.com:6380/1", "unix:///run/redis.sock"):
        check_redis_url(url)


def test_passwords_never_reach_a_message():
    assert redacted("redis+sentinel://app:pw@h:1,h2/m?sentinel_password=x") == (
        "redis+sentinel://app:***@h:1,h2/m?sentinel_password=***"
    )
    assert redacted("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert redacted("redis://h:6379/0") == "redis://h:6379/0"
    with pytest.raises(ValueError) as refused:
        check_redis_url("redis+sentinel://:hunter2@h:x/m")
    assert "hunter2" not in str(refused.value)
