// Calls to the gateway: the API key header, the OpenAI error envelope, SSE and timed audio reads.
import { state } from "./state.js";

const API_KEY_STORAGE = "chorus.apiKey";

export const apiKey = () => localStorage.getItem(API_KEY_STORAGE) || "";

export function setApiKey(key) {
  if (key) localStorage.setItem(API_KEY_STORAGE, key);
  else localStorage.removeItem(API_KEY_STORAGE);
}

/** An error from the gateway: `error` is the envelope's object ({message, type, param, code}),
 * or a request record's `error` ({code, message}); `status` is the HTTP status when there was one. */
export class ApiError extends Error {
  constructor(error, status = null) {
    super(error.message || `HTTP ${status}`);
    this.error = error;
    this.status = status;
  }
}

/** fetch() with the API key; a non-2xx answer throws ApiError carrying the envelope. */
export async function apiFetch(path, init = {}) {
  const headers = new Headers(init.headers);
  const key = apiKey();
  if (key) headers.set("Authorization", `Bearer ${key}`);
  const response = await fetch(path, { ...init, headers });
  if (!response.ok) throw await errorOf(response);
  return response;
}

export const getJson = async (path) => (await apiFetch(path)).json();

async function errorOf(response) {
  let error = { message: `HTTP ${response.status} ${response.statusText}`.trim() };
  try {
    const body = await response.json();
    if (body && body.error) error = body.error;
  } catch {
    // not JSON (a proxy's error page, say): keep the status line
  }
  return new ApiError(error, response.status);
}

/** The server-sent events of a response, as {event, data}. EventSource cannot send an
 * Authorization header, so the stream is read with fetch and parsed here. */
export async function* sseEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffered += value.replaceAll("\r\n", "\n");
    let end;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const block = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
      }
      if (data.length) yield { event, data: JSON.parse(data.join("\n")) };
    }
  }
}

/** Reads an audio response to the end, timing it from `startedMs` (performance.now()).
 * `onBytes` sees each non-empty piece as it arrives; returns every piece. */
export async function readAudio(response, startedMs, onBytes = () => {}) {
  const reader = response.body.getReader();
  const pieces = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return pieces;
    if (!value.byteLength) continue;
    if (state.firstAudioMs === null) state.firstAudioMs = performance.now() - startedMs;
    state.bytesReceived += value.byteLength;
    pieces.push(value);
    onBytes(value);
  }
}
