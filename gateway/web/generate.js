// Text to audio (Stable Audio Open): an async job (202 + id), its progress events moving a
// <progress> bar step by step, then the finished file in a player.
import { ApiError, apiFetch, readAudio, sseEvents } from "./api.js";
import { fileName } from "./audio.js";
import { ResultView } from "./result_view.js";
import { beginRun, state } from "./state.js";

const FORMAT = "wav";

export class GenerateTab {
  constructor(root, catalog, recent) {
    this.form = root.querySelector("form");
    this.progress = root.querySelector("progress");
    this.progressText = root.querySelector(".progress-text");
    this.view = new ResultView(root.querySelector(".result"));
    this.catalog = catalog;
    this.recent = recent;
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.generate();
    });
  }

  async generate() {
    const fields = this.form.elements;
    this.view.reset();
    beginRun();
    this.progress.value = 0;
    this.progressText.textContent = "";
    const body = {
      model: this.catalog.diffusionModel,
      prompt: fields.prompt.value,
      duration_s: Number(fields.duration_s.value),
      num_steps: Number(fields.num_steps.value),
      response_format: FORMAT,
      mode: "async",
    };
    const button = this.form.querySelector("button[type=submit]");
    button.disabled = true;
    let requestId = null;
    let isFinished = false;
    try {
      const started = performance.now();
      const job = await (await apiFetch("/v1/audio/generations", jsonPost(body))).json();
      requestId = state.lastRequestId = job.id;
      this.recent.add({ id: requestId, kind: "text-to-audio", status: job.status, format: FORMAT });
      const final = await this.#follow(requestId);
      isFinished = true;
      this.recent.update(requestId, { status: final.status });
      if (final.status !== "done") throw new ApiError(final.error || { message: `request ${final.status}` });
      const audio = await apiFetch(`/v1/requests/${requestId}/audio`);
      const pieces = await readAudio(audio, started);
      const elapsedS = (performance.now() - started) / 1000;
      const audioS = final.usage?.audio_s;
      if (audioS) state.realTimeFactor = elapsedS / audioS;
      this.view.showMetrics({
        Steps: `${final.usage?.num_steps ?? body.num_steps}`,
        Audio: audioS ? `${audioS.toFixed(2)} s` : "",
        RTF: audioS ? state.realTimeFactor.toFixed(2) : "",
      });
      await this.view.show(new Blob(pieces, { type: audio.headers.get("content-type") }), fileName(requestId, FORMAT));
    } catch (err) {
      this.view.showError(err);
      if (requestId && !isFinished) this.recent.update(requestId, { status: "failed" });
    } finally {
      button.disabled = false;
    }
  }

  /** Follows the job's events, moving the bar; returns the final request view. */
  async #follow(requestId) {
    const response = await apiFetch(`/v1/requests/${requestId}/events`);
    for await (const { event, data } of sseEvents(response)) {
      // Progress events are snapshots polled from the request's record, so steps may be skipped;
      // the final event carries the record itself, with the last step.
      const progress = event === "progress" ? data : data.progress;
      if (progress) this.#showProgress(progress.step, progress.num_steps);
      if (event !== "progress") return data;
    }
    throw new Error("The progress stream ended early; resume the request from Recent requests.");
  }

  #showProgress(step, numSteps) {
    state.lastProgress = { step, num_steps: numSteps };
    this.progress.max = numSteps;
    this.progress.value = step;
    this.progressText.textContent = `step ${step} of ${numSteps}`;
  }
}

const jsonPost = (body) => ({
  method: "POST",
  headers: { "content-type": "application/json" },
  body: JSON.stringify(body),
});
