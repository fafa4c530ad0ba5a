// The page's recent requests, kept in localStorage so they survive a reload; "Resume" downloads a
// request's audio again by id (/v1/requests/{id}/audio replays the journal, then follows it live).
import { ApiError, apiFetch, getJson, readAudio } from "./api.js";
import { audioBlob, fileName } from "./audio.js";
import { ResultView } from "./result_view.js";
import { beginRun, state } from "./state.js";

const STORAGE_KEY = "chorus.recent";
const MAX_ENTRIES = 20;

export class RecentRequests {
  constructor(root) {
    this.list = root.querySelector("ol");
    this.empty = root.querySelector(".empty");
    this.view = new ResultView(root.querySelector(".result"));
    root.querySelector("button.clear").addEventListener("click", () => this.#save([]));
    this.#render();
  }

  /** Records a request the page started: {id, kind, status, format}. */
  add(entry) {
    if (!entry.id) return;
    this.#save([entry, ...this.#load().filter((old) => old.id !== entry.id)].slice(0, MAX_ENTRIES));
  }

  update(id, fields) {
    this.#save(this.#load().map((entry) => (entry.id === id ? { ...entry, ...fields } : entry)));
  }

  async resume(entry) {
    this.view.reset();
    beginRun();
    state.lastRequestId = entry.id;
    try {
      // A failed request's audio stream is cut off mid-way; its record says why.
      const before = await getJson(`/v1/requests/${entry.id}`);
      if (before.status === "failed" || before.status === "cancelled") {
        this.update(entry.id, { status: before.status });
        throw new ApiError(before.error || { message: `request ${before.status}` });
      }
      const started = performance.now();
      const response = await apiFetch(`/v1/requests/${entry.id}/audio`);
      const pieces = await readAudio(response, started);
      const after = await getJson(`/v1/requests/${entry.id}`);
      this.update(entry.id, { status: after.status });
      const contentType = response.headers.get("content-type");
      await this.view.show(audioBlob(pieces, entry.format, contentType), fileName(entry.id, entry.format));
    } catch (err) {
      this.view.showError(err);
    }
  }

  #load() {
    try {
      return JSON.parse(localStorage.getItem(STORAGE_KEY)) || [];
    } catch {
      return []; // unreadable (edited by hand): start over
    }
  }

  #save(entries) {
    localStorage.setItem(STORAGE_KEY, JSON.stringify(entries));
    this.#render();
  }

  #render() {
    const entries = this.#load();
    this.empty.hidden = entries.length > 0;
    this.list.replaceChildren(...entries.map((entry) => this.#item(entry)));
  }

  #item(entry) {
    const item = document.createElement("li");
    item.dataset.id = entry.id;
    const id = document.createElement("code");
    id.textContent = entry.id;
    const kind = document.createElement("span");
    kind.className = "kind";
    kind.textContent = entry.kind;
    const status = document.createElement("span");
    status.className = `status ${entry.status}`;
    status.textContent = entry.status;
    const resume = document.createElement("button");
    resume.type = "button";
    resume.textContent = "Resume";
    resume.setAttribute("aria-label", `Resume ${entry.kind} request ${entry.id}`);
    resume.addEventListener("click", () => this.resume(entry));
    item.append(id, kind, status, resume);
    return item;
  }
}
