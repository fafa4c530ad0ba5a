"""The web page in headless Chromium against the real stack: each tab's request plays audio, and a voice
saved in the voice clone tab speaks.

The tests share one page and run in file order: the recent-requests test resumes what the
earlier ones made. Every test ends with the page's log clean (no console errors, no failed
requests).
"""

from __future__ import annotations

import json
import math
import time
import wave
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import numpy as np
import pytest

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
WAIT_MS = 30_000
STATE = "window.chorus.state"


class PageLog:
    """What went wrong in the page: console errors, uncaught exceptions, failed or refused requests."""

    def __init__(self, page) -> None:
        self.problems: list[str] = []
        page.on("console", lambda message: message.type == "error" and self.problems.append(f"console: {message.text}"))
        page.on("pageerror", lambda error: self.problems.append(f"exception: {error}"))
        page.on("requestfailed", lambda request: self.problems.append(f"failed: {request.url} {request.failure}"))
        page.on("response", lambda reply: reply.status >= 400 and self.problems.append(f"{reply.status}: {reply.url}"))


@pytest.fixture(scope="module")
def page(chromium, stack_url):
    context = chromium.new_context(viewport={"width": 1000, "height": 800})
    page = context.new_page()
    page.log = PageLog(page)
    page.goto(stack_url + "/")
    page.evaluate("window.chorus.ready")
    yield page
    context.close()


def state(page) -> dict:
    return page.evaluate(STATE)


def wait_for_state(page, condition: str) -> dict:
    """Waits until `condition` (JS over `s`, the page state) holds, or an error shows; returns the state."""
    page.wait_for_function(f"(s => ({condition}) || s.lastError)({STATE})", timeout=WAIT_MS)
    current = state(page)
    assert current["lastError"] is None, current["lastError"]
    return current


def js_round(value: float) -> int:
    """`Math.round`: halves go up (Python's `round` goes to even: 128.5 → 128 where the page shows 129)."""
    return math.floor(value + 0.5)


def js_fixed(value: float, digits: int = 2) -> str:
    """`Number.prototype.toFixed`: the double's exact decimal value, halves up."""
    return str(Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def assert_clean(page) -> None:
    assert page.log.problems == []


def reference_wav(path: Path, duration_s: float = 1.0, sample_rate_hz: int = 24_000) -> Path:
    """A short tone as a 16-bit mono WAV file: a voice-clone reference."""
    t = np.arange(int(duration_s * sample_rate_hz)) / sample_rate_hz
    samples = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate_hz)
        out.writeframes(samples.tobytes())
    return path


def test_page_loads_with_models_and_voices(page):
    assert page.title() == "Chorus"
    assert "tiny" in page.locator("#catalog-status").inner_text()
    voices = page.locator("#speech-voice option").all_inner_texts()
    assert "ryan" in voices
    assert page.locator("#speech-language").input_value() == "auto"
    assert page.locator("#generate-form").evaluate("form => !form.inert")
    assert_clean(page)


def test_streamed_speech_plays_while_it_arrives(page):
    page.get_by_role("tab", name="Text to speech").click()
    panel = page.locator("#panel-speech")
    panel.get_by_label("Voice").select_option("ryan")
    panel.get_by_label("Stream").check()

    def fixed_length(route):  # a sampled early EOS could end the stream within the player's 50 ms start lead
        body = json.loads(route.request.post_data) | {"max_frames": 40, "ignore_eos": True}
        route.continue_(post_data=json.dumps(body))

    page.route("**/v1/audio/speech", fixed_length)
    try:
        panel.get_by_role("button", name="Speak").click()
        done = wait_for_state(page, "s.playing && s.realTimeFactor !== null")
    finally:
        page.unroute("**/v1/audio/speech", fixed_length)
    assert done["bytesReceived"] == 40 * 1920 * 2  # 40 frames of 80 ms at 24 kHz, 16-bit
    assert done["playingBeforeStreamEnd"] is True  # Web Audio began before the last byte came
    assert 0 < done["firstAudioMs"] < 10_000 and done["realTimeFactor"] > 0
    metrics = page.locator("#speech-result .metrics").inner_text()
    assert f"{js_round(done['firstAudioMs'])} ms" in metrics and f"{js_fixed(done['realTimeFactor'])}" in metrics
    assert page.locator("#speech-result a[download]").get_attribute("download").endswith(".wav")
    assert_clean(page)


def test_whole_wav_file_plays_in_the_audio_element(page):
    panel = page.locator("#panel-speech")
    panel.get_by_label("Stream").uncheck()
    panel.get_by_label("Format").select_option("wav")
    panel.get_by_role("button", name="Speak").click()
    done = wait_for_state(page, "s.playing && s.realTimeFactor !== null")
    assert done["bytesReceived"] > 44 and done["playingBeforeStreamEnd"] is None
    player = page.locator("#speech-result audio")
    assert player.evaluate("audio => audio.src.startsWith('blob:')")
    # `playing` fires before the first sample is out: on a busy machine currentTime still reads 0 then. It moves on
    # (or the short clip has ended) within the wait.
    page.wait_for_function(
        "audio => audio.ended || (!audio.paused && audio.currentTime > 0)", arg=player.element_handle(), timeout=WAIT_MS
    )
    assert "RTF" in page.locator("#speech-result .metrics").inner_text()
    assert_clean(page)


def test_api_key_is_sent_and_an_error_shows_the_envelope(page):
    key = page.get_by_label("API key")
    key.fill("sk-web-test")
    key.blur()  # the key is taken on change (and stored in localStorage)
    panel = page.locator("#panel-speech")
    text = panel.get_by_label("Text", exact=True)
    text.fill("x" * 5000)  # over the gateway's 4096-character limit: a 400 with the error envelope
    with page.expect_request("**/v1/audio/speech") as sent:
        panel.get_by_role("button", name="Speak").click()
    assert sent.value.headers["authorization"] == "Bearer sk-web-test"
    error = panel.locator(".error")
    error.wait_for()
    assert error.inner_text() == "invalid_request_error: input: is 5000 characters; the limit is 4096 (input)"
    assert state(page)["lastError"]["param"] == "input"
    # The refused request is the page's only problem (its response, and Chromium's console line about it).
    assert len(page.log.problems) == 2 and all("400" in problem for problem in page.log.problems), page.log.problems
    page.log.problems.clear()
    text.fill("Hello again.")
    key.fill("")
    key.blur()
    assert page.evaluate("localStorage.getItem('chorus.apiKey')") is None


def test_voice_clone_from_an_uploaded_reference(page, tmp_path):
    page.get_by_role("tab", name="Voice clone").click()
    panel = page.locator("#panel-clone")
    panel.get_by_label("Reference audio").set_input_files(reference_wav(tmp_path / "me.wav"))
    panel.get_by_label("What the reference says").fill("A steady tone.")
    panel.get_by_role("button", name="Clone and speak").click()
    done = wait_for_state(page, "s.playing && s.realTimeFactor !== null")
    assert done["bytesReceived"] > 44
    assert page.locator("#clone-result audio").evaluate("audio => !audio.paused")
    assert_clean(page)


def test_voice_clone_from_a_microphone_recording(page):
    panel = page.locator("#panel-clone")
    record = panel.get_by_role("button", name="Record")
    record.click()  # Chromium's fake microphone: a beep, granted without a prompt
    page.wait_for_timeout(1000)
    panel.get_by_role("button", name="Stop").click()
    panel.get_by_text("Recorded.").wait_for()
    assert panel.get_by_label("Reference preview").evaluate("audio => audio.src.startsWith('blob:')")
    assert panel.get_by_label("Reference audio").input_value() == ""  # the recording replaced the file
    panel.get_by_label("What the reference says").fill("")  # no transcript: speaker embedding only
    panel.get_by_role("button", name="Clone and speak").click()
    done = wait_for_state(page, "s.playing && s.realTimeFactor !== null")
    assert done["bytesReceived"] > 44
    assert_clean(page)


def test_voice_clone_saves_the_reference_as_a_voice_then_speaks_with_it(page, tmp_path):
    panel = page.locator("#panel-clone")
    picker = panel.get_by_label("Saved voice")
    panel.get_by_label("Reference audio").set_input_files(reference_wav(tmp_path / "saved.wav"))
    panel.get_by_label("What the reference says").fill("A steady tone.")
    panel.get_by_label("Voice name").fill("Web voice")
    is_save = lambda reply: reply.request.method == "POST" and "/v1/audio/voices" in reply.url  # noqa: E731
    with page.expect_response(is_save) as saved:
        panel.get_by_role("button", name="Save voice").click()
    voice = saved.value.json()
    assert saved.value.status == 201 and (voice["name"], voice["x_vector_only"]) == ("Web voice", False)
    panel.get_by_text("Saved “Web voice”.").wait_for()
    assert picker.input_value() == voice["id"]  # picked: the reference inputs rest
    assert panel.get_by_label("Reference audio").is_disabled()

    with page.expect_request("**/v1/audio/speech") as sent:
        panel.get_by_role("button", name="Clone and speak").click()
    assert sent.value.post_data_json["voice"] == voice["id"] and "ref_audio" not in sent.value.post_data_json
    done = wait_for_state(page, "s.playing && s.realTimeFactor !== null")
    assert done["bytesReceived"] > 44

    with page.expect_response(lambda reply: reply.request.method == "DELETE") as deleted:
        panel.get_by_role("button", name="Delete voice").click()
    assert deleted.value.status == 200
    panel.get_by_text("Deleted.").wait_for()
    assert picker.input_value() == "" and panel.get_by_label("Reference audio").is_enabled()
    assert voice["id"] not in picker.locator("option").evaluate_all("options => options.map(o => o.value)")
    assert_clean(page)


def test_text_to_audio_progress_advances_then_plays(page):
    page.get_by_role("tab", name="Text to audio").click()
    panel = page.locator("#panel-generate")
    panel.get_by_label("Duration (s)").fill("0.5")  # the tiny model's clips are short
    panel.get_by_label("Steps", exact=True).fill("150")
    panel.get_by_role("button", name="Generate").click()
    bar = page.locator("#generate-progress")
    values = []  # the bar's value each time it moved, until the player starts
    deadline = time.monotonic() + WAIT_MS / 1000
    while not (current := state(page))["playing"] and current["lastError"] is None:
        value = bar.evaluate("bar => bar.value")
        if value > 0 and (not values or values[-1] != value):
            values.append(value)
        assert time.monotonic() < deadline, values
    assert current["lastError"] is None, current["lastError"]
    assert len(values) >= 2 and values == sorted(values) and values[-1] == 150, values
    assert current["lastProgress"] == {"step": 150, "num_steps": 150}
    assert bar.evaluate("bar => bar.max") == 150
    assert page.locator("#generate-result audio").is_visible()
    assert_clean(page)


def test_recent_requests_list_them_and_resume_plays_one(page):
    page.get_by_role("tab", name="Recent requests").click()
    items = page.locator("#recent-list li")
    assert items.locator(".kind").all_inner_texts() == ["text-to-audio", *["speech"] * 5]
    assert items.locator(".status").all_inner_texts() == ["done"] * 6
    streamed = items.last  # the first request: raw PCM, handed back as WAV
    request_id = streamed.locator("code").inner_text()
    streamed.get_by_role("button", name="Resume").click()
    done = wait_for_state(page, f"s.playing && s.lastRequestId === {request_id!r}")
    assert done["bytesReceived"] > 0
    assert page.locator("#recent-result audio").evaluate("audio => !audio.paused")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web-page.png"), full_page=True)
    assert_clean(page)
