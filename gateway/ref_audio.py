"""Voice-clone reference audio from a request: base64, a data: URI, or a URL on an allowed host.

URLs are refused unless the operator allow-lists their host (a gateway that fetches any URL is
a server-side request forgery hole). Whatever arrives must decode as audio, checked here so a
bad upload is a 400 naming its field (`ref_audio`, or a saved voice's `audio`), not a failure
deep in the vocoder.
"""

from __future__ import annotations

import base64
import binascii
import io
import urllib.parse

import av
import httpx

from chorus.gateway.errors import InvalidParam

_FETCH_TIMEOUT_S = 10.0


def _decode_base64(text: str, param: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidParam(param, "is neither a URL, a data: URI nor valid base64") from None


def check_is_audio(data: bytes, param: str = "ref_audio") -> None:
    """Raises InvalidParam unless `data` holds at least one decodable audio frame."""
    if not data:
        raise InvalidParam(param, "is empty")
    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.audio:
                raise InvalidParam(param, "holds no audio stream")
            for _ in container.decode(audio=0):
                return
    except (av.FFmpegError, UnicodeDecodeError):
        pass
    raise InvalidParam(param, "could not be decoded as audio (wav, flac, mp3, ogg, … expected)")


async def _fetch(url: str, max_bytes: int, param: str) -> bytes:
    async with httpx.AsyncClient(timeout=_FETCH_TIMEOUT_S, follow_redirects=False) as client:
        try:
            async with client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise InvalidParam(param, f"fetching the URL answered HTTP {response.status_code}")
                parts, num_bytes = [], 0
                async for part in response.aiter_bytes():
                    num_bytes += len(part)
                    if num_bytes > max_bytes:
                        raise InvalidParam(param, f"is larger than {max_bytes} bytes")
                    parts.append(part)
        except httpx.HTTPError as exc:
            raise InvalidParam(param, f"could not be fetched ({type(exc).__name__})") from None
    return b"".join(parts)


async def resolve_ref_audio(
    value: str, allowed_hosts: tuple[str, ...], max_bytes: int, param: str = "ref_audio"
) -> bytes:
    """The bytes of the audio file `value` refers to; raises InvalidParam(param, …) otherwise."""
    if value.startswith("data:"):
        header, _, payload = value.partition(",")
        if not header.endswith(";base64"):
            raise InvalidParam(param, "data: URIs must be base64-encoded")
        data = _decode_base64(payload, param)
    elif "://" in value:
        parsed = urllib.parse.urlsplit(value)
        if parsed.scheme not in ("http", "https") or parsed.hostname not in allowed_hosts:
            raise InvalidParam(param, "URLs are only accepted for hosts the operator allows; send base64")
        data = await _fetch(value, max_bytes, param)
    else:
        data = _decode_base64(value, param)
    if len(data) > max_bytes:
        raise InvalidParam(param, f"is larger than {max_bytes} bytes")
    check_is_audio(data, param)
    return data
