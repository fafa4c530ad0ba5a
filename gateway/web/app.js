// The page's entry point: tabs, the API key, the catalog (models, voices, languages), the tabs' wiring.
import { apiKey, getJson, setApiKey } from "./api.js";
import { CloneTab } from "./clone.js";
import { GenerateTab } from "./generate.js";
import { RecentRequests } from "./recent.js";
import { SpeechTab } from "./speech.js";
import { state } from "./state.js";

// Filled from /v1/models; the tabs read it when they send a request.
const catalog = { speechModel: null, diffusionModel: null };

function setUpTabs() {
  const tabs = [...document.querySelectorAll("[role=tab]")];
  const select = (chosen) => {
    for (const tab of tabs) {
      const isChosen = tab === chosen;
      tab.setAttribute("aria-selected", String(isChosen));
      tab.tabIndex = isChosen ? 0 : -1;
      document.getElementById(tab.getAttribute("aria-controls")).hidden = !isChosen;
    }
  };
  tabs.forEach((tab, index) => {
    tab.addEventListener("click", () => select(tab));
    // Arrow keys move between tabs, as the ARIA tabs pattern has it.
    tab.addEventListener("keydown", (event) => {
      const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
      if (!step) return;
      const next = tabs[(index + step + tabs.length) % tabs.length];
      select(next);
      next.focus();
    });
  });
  select(tabs[0]);
}

function fillSelect(select, values, preferred) {
  select.replaceChildren(...values.map((value) => new Option(value, value)));
  if (values.includes(preferred)) select.value = preferred;
}

async function loadCatalog() {
  const status = document.getElementById("catalog-status");
  const forms = document.querySelectorAll("main form");
  try {
    const [models, voices] = await Promise.all([getJson("/v1/models"), getJson("/v1/audio/voices")]);
    catalog.speechModel = models.data.find((model) => model.task === "text-to-speech")?.id ?? voices.model;
    catalog.diffusionModel = models.data.find((model) => model.task === "text-to-audio")?.id ?? null;
    // Checkpoints without named speakers (voice clone only) take no voice.
    fillSelect(document.getElementById("speech-voice"), voices.voices);
    for (const id of ["speech-language", "clone-language"]) {
      fillSelect(document.getElementById(id), voices.languages, "auto");
    }
    status.textContent = `Models: ${models.data.map((model) => model.id).join(", ")}`;
    status.classList.remove("error");
    await clone.savedVoices.load();
    forms.forEach((form) => (form.inert = false));
    document.getElementById("generate-form").inert = !catalog.diffusionModel;
    document.getElementById("generate-unavailable").hidden = Boolean(catalog.diffusionModel);
  } catch (err) {
    state.lastError = err.error || { message: err.message };
    status.textContent = `Cannot list models: ${err.message}`;
    status.classList.add("error");
    forms.forEach((form) => (form.inert = true));
  }
}

function setUpApiKey() {
  const input = document.getElementById("api-key");
  input.value = apiKey();
  // A new key may unlock the catalog (401 before it).
  input.addEventListener("change", () => {
    setApiKey(input.value.trim());
    loadCatalog();
  });
}

setUpTabs();
setUpApiKey();
const recent = new RecentRequests(document.getElementById("panel-recent"));
new SpeechTab(document.getElementById("panel-speech"), catalog, recent);
const clone = new CloneTab(document.getElementById("panel-clone"), catalog, recent);
new GenerateTab(document.getElementById("panel-generate"), catalog, recent);
window.chorus.ready = loadCatalog();
