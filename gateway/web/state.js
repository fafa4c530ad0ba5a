// What the page last did, readable as `window.chorus.state` (the browser test and the curious
// look here instead of scraping the DOM).
export const state = {
  bytesReceived: 0, // audio bytes of the current response so far
  firstAudioMs: null, // request sent → first non-empty audio bytes
  realTimeFactor: null, // elapsed / audio seconds
  playing: false, // latched once a Web Audio source or an <audio> element really plays
  playingBeforeStreamEnd: null, // streaming: playback began while bytes were still arriving
  lastProgress: null, // text to audio: {step, num_steps}
  lastRequestId: null,
  lastError: null, // the error envelope's `error` object, or {message}
};

/** Clears the per-request fields when a new request starts. */
export function beginRun() {
  Object.assign(state, {
    bytesReceived: 0,
    firstAudioMs: null,
    realTimeFactor: null,
    playing: false,
    playingBeforeStreamEnd: null,
    lastProgress: null,
    lastRequestId: null,
    lastError: null,
  });
}

window.chorus = { state };
