// Voice clone: a reference recording (an uploaded file or one made with the microphone) and,
// optionally, what it says; sent as multipart/form-data with `ref_audio` as the file. Or a saved
// voice, named in the request: the reference can be saved as one.
import { runSpeech } from "./speech.js";
import { ResultView } from "./result_view.js";
import { SavedVoices } from "./saved_voices.js";
import { beginRun } from "./state.js";

const FORMAT = "wav";

export class CloneTab {
  constructor(root, catalog, recent) {
    this.form = root.querySelector("form");
    this.view = new ResultView(root.querySelector(".result"));
    this.catalog = catalog;
    this.recent = recent;
    this.recorded = null; // the microphone recording, a Blob, until a file is chosen
    this.recorder = null;
    this.recordButton = this.form.querySelector("button.record");
    this.recordStatus = this.form.querySelector(".record-status");
    this.preview = this.form.querySelector("audio.reference");
    this.previewUrl = null;
    const canRecord = Boolean(navigator.mediaDevices?.getUserMedia) && "MediaRecorder" in window;
    this.recordButton.disabled = !canRecord;
    if (!canRecord) this.recordStatus.textContent = "Recording needs a microphone and a secure (https or localhost) page.";
    this.recordButton.addEventListener("click", () => this.#toggleRecording());
    this.form.elements.ref_audio.addEventListener("change", () => {
      this.recorded = null;
      this.#preview(this.form.elements.ref_audio.files[0] || null);
    });
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.clone();
    });
    // A picked saved voice brings its own reference: the reference inputs rest meanwhile.
    const referenceInputs = this.form.querySelector("fieldset.reference");
    this.savedVoices = new SavedVoices(this.form, (voiceId) => (referenceInputs.disabled = Boolean(voiceId)));
    this.saveStatus = this.form.querySelector(".save-status");
    this.form.querySelector("button.save-voice").addEventListener("click", () => this.saveVoice());
    this.form.querySelector("button.delete-voice").addEventListener("click", () => this.deleteVoice());
  }

  /** The chosen file or the recording; shows an error and returns null when there is neither. */
  #reference() {
    const reference = this.form.elements.ref_audio.files[0] || this.recorded;
    if (!reference) this.view.showError(new Error("Choose a reference file or record one first."));
    return reference || null;
  }

  async clone() {
    const fields = this.form.elements;
    this.view.reset();
    beginRun();
    if (this.savedVoices.picked) {
      const body = { model: this.catalog.speechModel, input: fields.text.value, response_format: FORMAT };
      body.voice = this.savedVoices.picked;
      if (fields.language.value) body.language = fields.language.value;
      await this.#speak(body);
      return;
    }
    const reference = this.#reference();
    if (!reference) return;
    const body = new FormData();
    body.append("model", this.catalog.speechModel);
    body.append("input", fields.text.value);
    body.append("response_format", FORMAT);
    if (fields.language.value) body.append("language", fields.language.value);
    body.append("ref_audio", reference, reference.name || "recording.webm");
    const refText = fields.ref_text.value.trim();
    // Without its transcript the reference cannot prompt the talker in context; the speaker
    // embedding alone (x-vector) still carries the voice.
    if (refText) body.append("ref_text", refText);
    else body.append("x_vector_only", "true");
    await this.#speak(body);
  }

  async #speak(body) {
    const button = this.form.querySelector("button[type=submit]");
    button.disabled = true;
    await runSpeech({ body, format: FORMAT, view: this.view, recent: this.recent });
    button.disabled = false;
  }

  async saveVoice() {
    const fields = this.form.elements;
    this.view.reset();
    beginRun();
    this.saveStatus.textContent = "";
    const reference = this.#reference();
    const name = fields.voice_name.value.trim();
    if (!reference) return;
    if (!name) {
      this.view.showError(new Error("Name the voice first."));
      return;
    }
    const refText = fields.ref_text.value.trim();
    try {
      const voice = await this.savedVoices.save({ name, reference, refText, language: fields.language.value });
      this.saveStatus.textContent = `Saved “${voice.name}”.`;
    } catch (err) {
      this.view.showError(err);
    }
  }

  async deleteVoice() {
    this.view.reset();
    beginRun();
    try {
      await this.savedVoices.deletePicked();
      this.saveStatus.textContent = "Deleted.";
    } catch (err) {
      this.view.showError(err);
    }
  }

  async #toggleRecording() {
    if (this.recorder) {
      this.recorder.stop();
      return;
    }
    try {
      const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
      const pieces = [];
      this.recorder = new MediaRecorder(stream);
      this.recorder.addEventListener("dataavailable", (event) => pieces.push(event.data));
      this.recorder.addEventListener("stop", () => {
        stream.getTracks().forEach((track) => track.stop());
        this.recorded = new Blob(pieces, { type: this.recorder.mimeType });
        this.recorder = null;
        this.form.elements.ref_audio.value = ""; // the recording replaces a chosen file
        this.recordButton.textContent = "Record";
        this.recordStatus.textContent = "Recorded.";
        this.#preview(this.recorded);
      });
      this.recorder.start();
      this.recordButton.textContent = "Stop";
      this.recordStatus.textContent = "Recording…";
    } catch (err) {
      this.recordStatus.textContent = `Cannot record: ${err.message}`;
    }
  }

  #preview(blob) {
    if (this.previewUrl) URL.revokeObjectURL(this.previewUrl);
    this.previewUrl = blob ? URL.createObjectURL(blob) : null;
    this.preview.hidden = !blob;
    if (blob) this.preview.src = this.previewUrl;
    else this.preview.removeAttribute("src");
  }
}
