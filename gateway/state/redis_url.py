"""The gateway's Redis address: a plain Redis URL, or a Redis Sentinel deployment.

    redis://[[username]:password@]host:port[/db]    one Redis (redis-py's URL form; rediss:// for TLS; unix://)
    redis+sentinel://[[username:]password@]host[:port][,host[:port]…]/service_name[/db][?sentinel_password=…]

A `redis+sentinel` URL lists the Sentinels (port 26379 when left out) and names the monitored master
(`service_name`, Sentinel's `<master-name>`); the gateway asks the Sentinels for the current master and
follows a failover by itself. The user name and password are those of the Redis master and replicas (here,
unlike in a redis:// URL, a lone `secret@` is a password); Sentinels that require a password of their own get it
as `sentinel_password`. Percent-encode reserved characters in
the password and names (`@` as %40, `/` as %2F). TLS to a Sentinel deployment is not supported.
"""

from __future__ import annotations

import dataclasses
import urllib.parse

SENTINEL_SCHEME = "redis+sentinel"
PLAIN_SCHEMES = ("redis", "rediss", "unix")
DEFAULT_SENTINEL_PORT = 26379


@dataclasses.dataclass(frozen=True, slots=True)
class SentinelAddress:
    sentinels: tuple[tuple[str, int], ...]
    service_name: str
    db: int = 0
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    sentinel_password: str | None = dataclasses.field(default=None, repr=False)


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() == SENTINEL_SCHEME


def check_redis_url(url: str) -> None:
    """Raises ValueError, saying what is wrong, unless `url` is one of the forms above."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme == SENTINEL_SCHEME:
        parse_sentinel_url(url)
    elif scheme not in PLAIN_SCHEMES:
        expected = ", ".join(f"{name}://" for name in (*PLAIN_SCHEMES, SENTINEL_SCHEME))
        raise ValueError(f"redis_url: expected a URL starting with {expected}; got {redacted(url)!r}")


def parse_sentinel_url(url: str) -> SentinelAddress:
    """The parts of a `redis+sentinel://` URL; ValueError naming the faulty part otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() != SENTINEL_SCHEME:
        raise ValueError(f"redis_url: not a {SENTINEL_SCHEME}:// URL: {redacted(url)!r}")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":") if ":" in userinfo else ("", "", userinfo)
    sentinels = tuple(_host_port(part, url) for part in hosts.split(","))
    path = [urllib.parse.unquote(part) for part in parts.path.split("/")[1:]]
    if not path or not path[0] or len(path) > 2:
        raise ValueError(f"redis_url: expected /service_name[/db] after the Sentinels in {redacted(url)!r}")
    db = path[1] if len(path) == 2 else "0"
    if not db.isdigit():
        raise ValueError(f"redis_url: database must be a number, got {db!r}")
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - {"sentinel_password"})
    if unknown:
        raise ValueError(f"redis_url: unknown option {', '.join(unknown)} (only sentinel_password is understood)")
    return SentinelAddress(
        sentinels=sentinels,
        service_name=path[0],
        db=int(db),
        username=urllib.parse.unquote(username) or None,
        password=urllib.parse.unquote(password) or None,
        sentinel_password=query.get("sentinel_password", [""])[-1] or None,
    )


def _host_port(part: str, url: str) -> tuple[str, int]:
    host, port = part.strip(), DEFAULT_SENTINEL_PORT
    if host.startswith("["):  # [IPv6]:port
        host, _, rest = host[1:].partition("]")
        if rest:
            port = _port(rest.removeprefix(":"), url)
    elif ":" in host:
        host, _, text = host.rpartition(":")
        port = _port(text, url)
    if not host:
        raise ValueError(f"redis_url: a Sentinel address has no host in {redacted(url)!r}")
    return host, port


def _port(text: str, url: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"redis_url: bad Sentinel port {text!r} in {redacted(url)!r}")
    return int(text)


def redacted(url: str) -> str:
    """The URL with its password and options masked, for error messages and logs."""
    parts = urllib.parse.urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    netloc = f"{userinfo.partition(':')[0] if ':' in userinfo else ''}:***@{hosts}" if at else hosts
    query = "&".join(f"{name}=***" for name in urllib.parse.parse_qs(parts.query, keep_blank_values=True))
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))
