// Text to speech. Streamed: PCM played through Web Audio while it downloads. Not streamed: the
// whole file in the chosen format, then an <audio> player. Both show time to first audio and RTF.
import { ApiError, apiFetch, getJson, readAudio } from "./api.js";
import { audioBlob, audioSeconds, fileName, pcmSeconds } from "./audio.js";
import { PcmStreamPlayer } from "./pcm_stream.js";
import { ResultView } from "./result_view.js";
import { beginRun, state } from "./state.js";

/** One POST /v1/audio/speech from start to player, for this tab and the voice clone tab.
 * `body` is a JSON object or FormData; `player` (streamed PCM only) plays pieces as they come. */
export async function runSpeech({ body, format, view, recent, player = null }) {
  const init = { method: "POST", body };
  if (!(body instanceof FormData)) {
    init.headers = { "content-type": "application/json" };
    init.body = JSON.stringify(body);
  }
  const started = performance.now();
  let requestId = null;
  let isStreaming = false;
  const showMetrics = (audioS) => {
    const elapsedS = (performance.now() - started) / 1000;
    if (audioS) state.realTimeFactor = elapsedS / audioS;
    view.showMetrics({
      "First audio": state.firstAudioMs === null ? "" : `${Math.round(state.firstAudioMs)} ms`,
      RTF: audioS ? state.realTimeFactor.toFixed(2) : "",
      Audio: audioS ? `${audioS.toFixed(2)} s` : "",
      Received: `${state.bytesReceived.toLocaleString()} bytes`,
    });
  };
  if (player) {
    player.onPlaying = () => {
      state.playing = true;
      state.playingBeforeStreamEnd = isStreaming;
    };
  }
  try {
    const response = await apiFetch("/v1/audio/speech", init);
    requestId = state.lastRequestId = response.headers.get("x-request-id");
    recent.add({ id: requestId, kind: "speech", status: "running", format });
    isStreaming = true;
    const pieces = await readAudio(response, started, (bytes) => {
      player?.push(bytes);
      showMetrics(null);
    });
    isStreaming = false;
    const blob = audioBlob(pieces, format, response.headers.get("content-type"));
    showMetrics(format === "pcm" ? pcmSeconds(state.bytesReceived) : await audioSeconds(blob));
    recent.update(requestId, { status: "done" });
    // A streamed result has played already; the player then holds it for replay and download.
    await view.show(blob, fileName(requestId, format), { autoplay: !player });
  } catch (err) {
    view.showError(await explain(err, requestId));
    if (requestId) recent.update(requestId, { status: "failed" });
  }
}

/** A stream cut off mid-way is only a network error to fetch; the request's record says why. */
async function explain(err, requestId) {
  if (err instanceof ApiError || !requestId) return err;
  try {
    const record = await getJson(`/v1/requests/${requestId}`);
    return record.error ? new ApiError(record.error) : err;
  } catch {
    return err;
  }
}

export class SpeechTab {
  constructor(root, catalog, recent) {
    this.form = root.querySelector("form");
    this.view = new ResultView(root.querySelector(".result"));
    this.catalog = catalog;
    this.recent = recent;
    this.player = null;
    const { stream, format } = this.form.elements;
    // Streaming always carries raw PCM: it is what Web Audio can play piece by piece.
    const syncFormat = () => (format.disabled = stream.checked);
    stream.addEventListener("change", syncFormat);
    syncFormat();
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.speak();
    });
  }

  async speak() {
    const fields = this.form.elements;
    const format = fields.stream.checked ? "pcm" : fields.format.value;
    this.player?.stop();
    this.view.reset();
    beginRun();
    // Made before the first await, while still inside the click: the browser then lets it play.
    this.player = fields.stream.checked ? new PcmStreamPlayer() : null;
    const body = { model: this.catalog.speechModel, input: fields.text.value, response_format: format };
    if (fields.voice.value) body.voice = fields.voice.value;
    if (fields.language.value) body.language = fields.language.value;
    const button = this.form.querySelector("button[type=submit]");
    button.disabled = true;
    await runSpeech({ body, format, view: this.view, recent: this.recent, player: this.player });
    button.disabled = false;
  }
}
