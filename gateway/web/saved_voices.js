// Saved voices in the voice clone tab: pick one (the gateway keeps its reference: nothing is uploaded),
// save the current reference under a name, delete the picked one.
import { apiFetch, getJson } from "./api.js";

export class SavedVoices {
  /** `onPick(voiceId)` hears each change of the picked voice (null: a new reference). */
  constructor(form, onPick) {
    this.select = form.elements.saved_voice;
    this.deleteButton = form.querySelector("button.delete-voice");
    this.onPick = onPick;
    this.select.addEventListener("change", () => this.#picked());
  }

  /** The picked voice's id, or null for a new reference. */
  get picked() {
    return this.select.value || null;
  }

  /** Lists your saved voices (every page), picking `voiceId` when it is one of them. */
  async load(voiceId = this.picked) {
    const voices = [];
    let after = null;
    do {
      const query = new URLSearchParams({ limit: "100", ...(after && { after }) });
      const page = await getJson(`/v1/audio/voices?${query}`);
      voices.push(...page.data.filter((voice) => voice.kind !== "builtin"));
      after = page.has_more ? page.last_id : null;
    } while (after);
    const options = voices.map((voice) => new Option(voice.name, voice.id));
    this.select.replaceChildren(new Option("A new reference (below)", ""), ...options);
    this.select.value = voices.some((voice) => voice.id === voiceId) ? voiceId : "";
    this.#picked();
  }

  /** Saves `reference` (a Blob) as the voice `name` and picks it; returns the voice. Throws ApiError. */
  async save({ name, reference, refText, language }) {
    const body = new FormData();
    body.append("name", name);
    body.append("audio", reference, reference.name || "recording.webm");
    // Without a transcript the gateway keeps the speaker embedding alone (no in-context cloning).
    if (refText) body.append("ref_text", refText);
    if (language && language !== "auto") body.append("language", language);
    const voice = await (await apiFetch("/v1/audio/voices", { method: "POST", body })).json();
    await this.load(voice.id);
    return voice;
  }

  /** Deletes the picked voice. Throws ApiError. */
  async deletePicked() {
    await apiFetch(`/v1/audio/voices/${encodeURIComponent(this.picked)}`, { method: "DELETE" });
    await this.load(null);
  }

  #picked() {
    this.deleteButton.disabled = !this.picked;
    this.onPick(this.picked);
  }
}
