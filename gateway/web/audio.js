// Audio helpers shared by the tabs: one AudioContext, raw PCM as WAV, decoded durations.

// The gateway's `pcm` format: 24 kHz mono signed 16-bit little-endian.
export const PCM_SAMPLE_RATE_HZ = 24000;
const PCM_BYTES_PER_SAMPLE = 2;

let context = null;

/** One AudioContext for the page (browsers cap how many may exist). Created on first use, which
 * is inside a click handler, so autoplay rules let it run. */
export function audioContext() {
  context ??= new AudioContext();
  if (context.state === "suspended") context.resume();
  return context;
}

export const pcmSeconds = (numBytes) => numBytes / PCM_BYTES_PER_SAMPLE / PCM_SAMPLE_RATE_HZ;

/** Raw gateway PCM pieces as a playable WAV file (the 44-byte RIFF header in front). */
export function wavBlob(pieces) {
  const numBytes = pieces.reduce((sum, piece) => sum + piece.byteLength, 0);
  const header = new DataView(new ArrayBuffer(44));
  const text = (offset, value) => [...value].forEach((c, i) => header.setUint8(offset + i, c.charCodeAt(0)));
  text(0, "RIFF");
  header.setUint32(4, 36 + numBytes, true);
  text(8, "WAVE");
  text(12, "fmt ");
  header.setUint32(16, 16, true); // fmt chunk size
  header.setUint16(20, 1, true); // integer PCM
  header.setUint16(22, 1, true); // mono
  header.setUint32(24, PCM_SAMPLE_RATE_HZ, true);
  header.setUint32(28, PCM_SAMPLE_RATE_HZ * PCM_BYTES_PER_SAMPLE, true);
  header.setUint16(32, PCM_BYTES_PER_SAMPLE, true);
  header.setUint16(34, 8 * PCM_BYTES_PER_SAMPLE, true);
  text(36, "data");
  header.setUint32(40, numBytes, true);
  return new Blob([header, ...pieces], { type: "audio/wav" });
}

/** Seconds of audio in an encoded file, or null when the browser cannot decode it. Decoding is
 * used rather than <audio>.duration, which streamed files (no length in the header) leave unknown. */
export async function audioSeconds(blob) {
  try {
    return (await audioContext().decodeAudioData(await blob.arrayBuffer())).duration;
  } catch {
    return null;
  }
}

// Raw PCM is handed out wrapped as WAV, so every download plays in an ordinary player.
const EXTENSIONS = { mp3: "mp3", opus: "ogg", aac: "aac", flac: "flac", wav: "wav", pcm: "wav" };

export const fileName = (requestId, format) => `chorus-${requestId || "audio"}.${EXTENSIONS[format] || "bin"}`;

/** The playable file for audio pieces in `format` (`contentType` as the gateway sent it). */
export const audioBlob = (pieces, format, contentType) =>
  format === "pcm" ? wavBlob(pieces) : new Blob(pieces, { type: contentType || "application/octet-stream" });
