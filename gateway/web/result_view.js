// A tab's result area: metrics, an <audio> player with a download link, and errors.
import { state } from "./state.js";

export class ResultView {
  constructor(root) {
    this.metrics = root.querySelector(".metrics");
    this.audio = root.querySelector("audio");
    this.download = root.querySelector("a[download]");
    this.error = root.querySelector(".error");
    this.url = null;
    this.audio.addEventListener("playing", () => {
      state.playing = true;
    });
  }

  reset() {
    this.audio.pause();
    this.audio.hidden = true;
    this.download.hidden = true;
    this.error.hidden = true;
    this.metrics.textContent = "";
  }

  /** {label: text} pairs, in order; empty values are left out. */
  showMetrics(entries) {
    this.metrics.replaceChildren(
      ...Object.entries(entries)
        .filter(([, value]) => value)
        .flatMap(([label, value]) => [element("dt", label), element("dd", value)]),
    );
  }

  /** Shows an ApiError's envelope fields (or any error's message); keeps it in state.lastError. */
  showError(err) {
    const error = err.error || { message: err.message || String(err) };
    state.lastError = error;
    const where = error.param ? ` (${error.param})` : "";
    const kind = [error.type, error.code].filter(Boolean).join(" / ");
    this.error.textContent = `${kind ? kind + ": " : ""}${error.message}${where}`;
    this.error.hidden = false;
  }

  /** Puts `blob` in the player (and starts it unless `autoplay` is false) and the download link. */
  async show(blob, filename, { autoplay = true } = {}) {
    if (this.url) URL.revokeObjectURL(this.url);
    this.url = URL.createObjectURL(blob);
    this.download.href = this.url;
    this.download.download = filename;
    this.download.hidden = false;
    this.audio.src = this.url;
    this.audio.hidden = false;
    if (!autoplay) return;
    // One thing plays at a time: starting this stops the other tabs' players.
    for (const other of document.querySelectorAll("audio")) if (other !== this.audio) other.pause();
    await this.audio.play().catch((err) => this.showError(err));
  }
}

function element(tag, text) {
  const node = document.createElement(tag);
  node.textContent = text;
  return node;
}
