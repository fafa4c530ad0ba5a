// Plays gateway PCM while it downloads: each piece becomes an AudioBuffer scheduled right after
// the previous one on the AudioContext clock, so the pieces join without gaps.
import { audioContext, PCM_SAMPLE_RATE_HZ } from "./audio.js";

// Slack before the first buffer: scheduling it at currentTime exactly would start it late and clip it.
const START_LEAD_S = 0.05;

export class PcmStreamPlayer {
  constructor() {
    this.context = audioContext();
    this.onPlaying = () => {}; // runs once, when the context's clock reaches the first buffer
    this.nextStartS = 0;
    this.sources = [];
    this.oddByte = null; // a sample split across two network pieces
    this.stopped = false;
  }

  /** Queues a piece of s16le bytes (any length, any alignment). */
  push(bytes) {
    if (this.stopped) return;
    if (this.oddByte !== null) {
      const joined = new Uint8Array(bytes.byteLength + 1);
      joined[0] = this.oddByte;
      joined.set(bytes, 1);
      bytes = joined;
      this.oddByte = null;
    }
    const numSamples = bytes.byteLength >> 1;
    if (bytes.byteLength % 2) this.oddByte = bytes[bytes.byteLength - 1];
    if (!numSamples) return;
    const view = new DataView(bytes.buffer, bytes.byteOffset, numSamples * 2);
    const samples = new Float32Array(numSamples);
    for (let i = 0; i < numSamples; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
    // The buffer keeps the gateway's rate; the context resamples to the output device's.
    const buffer = this.context.createBuffer(1, numSamples, PCM_SAMPLE_RATE_HZ);
    buffer.copyToChannel(samples, 0);
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    const startS = Math.max(this.nextStartS, this.context.currentTime + START_LEAD_S);
    source.start(startS);
    this.nextStartS = startS + buffer.duration;
    if (!this.sources.length) this.#watchStart(startS);
    this.sources.push(source);
  }

  /** Stops whatever is still scheduled (a new request replaces this one). */
  stop() {
    this.stopped = true;
    for (const source of this.sources) source.stop();
    this.sources = [];
  }

  #watchStart(startS) {
    const check = () => {
      if (this.stopped) return;
      if (this.context.state === "running" && this.context.currentTime >= startS) this.onPlaying();
      else setTimeout(check, 10);
    };
    check();
  }
}
