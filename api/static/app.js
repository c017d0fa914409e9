// The analysts' page: sign in with an API key, upload PDFs, validate an answer,
// judge the evidence pages. Plain DOM, no framework; every call goes to the
// /v1 API with the key in X-API-Key. Text from documents is only ever set with
// textContent / text nodes (see keywords.js), never parsed as HTML.

import { appendHighlighted, keywords, reflowed } from "./keywords.js";
import { documentStatus } from "./status.js";

const KEY_STORE = "evidentia.apiKey";
const ANALYST_STORE = "evidentia.analyst";
const POLL_MS = 1000;
const THUMB_WIDTH = 360;
const LARGE_WIDTH = 1100;
const THUMB_CONCURRENCY = 3;

const $ = (id) => document.getElementById(id);

const state = {
  key: null,
  documents: [],          // GET /v1/documents
  selected: new Set(),    // ticked document ids
  uploading: new Map(),   // local name -> file name, while the POST runs
  autoSelect: new Set(),  // ids uploaded here: ticked once ready
  pollTimer: null,
  validation: null,       // last POST /v1/validate answer
  terms: [],              // keywords of its question + answer
  objectUrls: new Set(),  // thumbnails to revoke
  options: null,          // GET /v1/validate/options: what the server can run, its defaults
  viewerVerdict: null,    // the verdict of the page in the larger view (its buttons are one of its views)
  viewerPage: null,       // {document_id, page} open in the larger view
  verdicts: new Map(),    // "document_id page" -> the verdict of that page, for the last validation
  searched: new Set(),    // the document ids the last validation searched
};

// -- API ----------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

async function api(path, { method = "GET", json, form, key = state.key, as = "json" } = {}) {
  const headers = { "X-API-Key": key || "" };
  let body;
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  } else if (form) {
    body = form;
  }
  let response;
  try {
    // page images may come from the browser cache (the server allows an hour); JSON never
    response = await fetch(path, { method, headers, body, cache: as === "blob" ? "default" : "no-store" });
  } catch (err) {
    throw new ApiError(0, "network", "Cannot reach the Evidentia server; check that it is running and retry.");
  }
  if (!response.ok) {
    let error = { code: "error", message: `${response.status} ${response.statusText}`, details: null };
    try {
      const payload = await response.json();
      if (payload && payload.error) error = payload.error;
    } catch (_) { /* not JSON: keep the status line */ }
    if (response.status === 401 && key === state.key && state.key) {
      signOut(`Your API key is no longer accepted: ${error.message}`);
    }
    throw new ApiError(response.status, error.code, error.message, error.details);
  }
  if (as === "blob") return response.blob();
  if (as === "text") return response.text();
  return response.status === 204 ? null : response.json();
}

const docPath = (id) => `/v1/documents/${encodeURIComponent(id)}`;

// -- messages -----------------------------------------------------------------
function showError(message) {
  $("banner-text").textContent = message;
  $("banner").hidden = false;
}

function clearError() {
  $("banner").hidden = true;
  $("banner-text").textContent = "";
}

function friendly(err) {
  const d = err.details;
  switch (err.code) {
    case "document_not_ready": {
      const items = Array.isArray(d) ? d : d ? [d] : [];
      const parts = items.map((x) => (x.status === "failed"
        ? `${x.document_id} failed to index (${x.reason || "unknown reason"}); upload it again`
        : `${x.document_id} is still ${x.status}; wait until it shows "ready"`));
      return parts.length ? parts.join(". ") + "." : err.message;
    }
    case "rate_limited":
      return `Too many requests: ${err.message}`;
    case "reranker_unavailable":
      return `${err.message}. Choose another reranker.`;
    case "validation_error":  // the API's field names, as the form labels them
      return Object.entries(FORM_LABELS).reduce((m, [field, label]) => m.replaceAll(`body.${field}:`, `${label}:`),
                                                err.message);
    default:
      return err.message;
  }
}

const FORM_LABELS = { question: "Question", answer: "Answer", top_k: "Candidate pages", threshold: "Threshold",
                      reranker: "Reranker", document_ids: "Documents" };

// -- sign in / out ------------------------------------------------------------
async function signIn(event) {
  event.preventDefault();
  clearError();
  const key = $("api-key").value.trim();
  if (!key) {
    showError("Paste your API key first.");
    $("api-key").focus();
    return;
  }
  $("login-button").disabled = true;
  try {
    const list = await api("/v1/documents", { key });
    state.key = key;
    sessionStorage.setItem(KEY_STORE, key);
    sessionStorage.setItem(ANALYST_STORE, $("analyst").value.trim());
    $("api-key").value = "";
    enterWorkspace(list.documents);
  } catch (err) {
    showError(err.status === 401 ? `This API key was not accepted: ${err.message}` : friendly(err));
  } finally {
    $("login-button").disabled = false;
  }
}

function signOut(message) {
  sessionStorage.removeItem(KEY_STORE);
  state.key = null;
  clearTimeout(state.pollTimer);
  state.pollTimer = null;
  state.documents = [];
  state.selected.clear();
  state.autoSelect.clear();
  clearResults();
  $("doc-list").replaceChildren();
  $("workspace").hidden = true;
  $("session").hidden = true;
  $("login").hidden = false;
  $("analyst").value = sessionStorage.getItem(ANALYST_STORE) || "";
  if (message) showError(message); else clearError();
  $("api-key").focus();
}

function enterWorkspace(documents) {
  const analyst = sessionStorage.getItem(ANALYST_STORE);
  $("session-label").textContent = analyst ? `Signed in as ${analyst}` : "Signed in";
  $("login").hidden = true;
  $("workspace").hidden = false;
  $("session").hidden = false;
  setDocuments(documents);
  loadOptions();
  $("question").focus();
}

const RERANKER_LABELS = { none: "None (first-stage order)", llm: "LLM", classifier: "Classifier",
                          cosine: "Cosine (untrained base model)" };

// The form offers what the server can run (an LLM without a configured endpoint fell
// back on every search) and shows the defaults a request gets.
async function loadOptions() {
  let options;
  try {
    options = await api("/v1/validate/options");
  } catch (err) {
    return;  // an older server: the form works with its defaults
  }
  state.options = options;
  const select = $("reranker");
  // a reranker the server runs that the form did not list (EVIDENTIA_DEFAULT_RERANKER=cosine
  // was overridden by the form's "none" on every validation)
  for (const offered of options.rerankers) {
    if (![...select.options].some((o) => o.value === offered.name)) {
      select.append(new Option(RERANKER_LABELS[offered.name] || offered.name, offered.name));
    }
  }
  for (const option of select.options) {
    const offered = options.rerankers.find((r) => r.name === option.value);
    if (!offered) continue;
    option.disabled = !offered.available;
    option.title = offered.note || "";
    option.textContent = (RERANKER_LABELS[option.value] || option.value) +
      (offered.available ? "" : " (not configured on this server)");
  }
  const fallback = [...select.options].find((o) => !o.disabled);
  if (select.selectedOptions[0] && select.selectedOptions[0].disabled && fallback) select.value = fallback.value;
  const byDefault = [...select.options].find((o) => o.value === options.default_reranker && !o.disabled);
  if (byDefault && !state.validation) select.value = byDefault.value;
  $("threshold").placeholder = `default ${options.threshold}`;
  $("top-k").placeholder = `default ${options.top_k}`;
  $("top-k").max = String(options.max_top_k);
  syncThreshold();
}

function syncThreshold() {
  const classifier = $("reranker").value === "classifier";
  $("threshold").disabled = !classifier;
  if (!classifier) $("threshold").value = "";
}

// -- documents ----------------------------------------------------------------
function setDocuments(documents) {
  state.documents = documents;
  for (const d of documents) {
    if (d.status === "ready" && state.autoSelect.has(d.document_id)) {
      state.selected.add(d.document_id);
      state.autoSelect.delete(d.document_id);
    }
  }
  const known = new Set(documents.filter((d) => d.status === "ready").map((d) => d.document_id));
  for (const id of [...state.selected]) if (!known.has(id)) state.selected.delete(id);
  renderDocuments();
  schedulePoll();
}

function renderDocuments() {
  const list = $("doc-list");
  const items = [];
  for (const [name, filename] of state.uploading) {
    const li = document.createElement("li");
    li.className = "doc uploading";
    li.dataset.status = "uploading";
    const title = document.createElement("span");
    title.className = "doc-name";
    title.textContent = filename;
    const badge = badgeFor("uploading");
    const info = document.createElement("span");
    info.className = "doc-info muted";
    info.textContent = "uploading…";
    li.append(document.createElement("span"), title, badge, info);
    li.dataset.name = name;
    items.push(li);
  }
  for (const d of state.documents) {
    const li = document.createElement("li");
    li.className = `doc ${d.status}`;
    li.dataset.documentId = d.document_id;
    li.dataset.status = d.status;
    const box = document.createElement("input");
    box.type = "checkbox";
    box.id = `doc-${d.document_id}`;
    box.className = "doc-check";
    box.value = d.document_id;
    box.disabled = d.status !== "ready";
    box.checked = state.selected.has(d.document_id);
    box.addEventListener("change", () => {
      if (box.checked) state.selected.add(d.document_id); else state.selected.delete(d.document_id);
    });
    const title = document.createElement("label");
    title.className = "doc-name";
    title.htmlFor = box.id;
    title.textContent = d.document_id;
    title.title = d.filename;
    const info = document.createElement("span");
    info.className = "doc-info" + (d.status === "failed" ? " error-text" : " muted");
    info.textContent = documentStatus(d);
    li.append(box, title, badgeFor(d.status), info);
    // the file's own name where the id hides it (Отчёт_2023.pdf is 2023-9293ec27)
    const stem = (d.filename || "").replace(/\.pdf$/i, "");
    if (stem && stem !== d.document_id) {
      const file = document.createElement("span");
      file.className = "doc-file muted small";
      file.textContent = d.filename;
      li.append(file);
    }
    items.push(li);
  }
  list.replaceChildren(...items);
  $("doc-empty").hidden = items.length > 0;
}

function badgeFor(status) {
  const badge = document.createElement("span");
  badge.className = `badge badge-${status}`;
  badge.textContent = status;
  return badge;
}

function schedulePoll() {
  clearTimeout(state.pollTimer);
  state.pollTimer = null;
  const pending = state.documents.some((d) => d.status === "queued" || d.status === "indexing");
  if (pending && state.key) state.pollTimer = setTimeout(refreshDocuments, POLL_MS);
}

async function refreshDocuments() {
  if (!state.key) return;
  try {
    const list = await api("/v1/documents");
    setDocuments(list.documents);
  } catch (err) {
    if (err.status !== 401) {
      showError(`Could not refresh the documents: ${friendly(err)}`);
      state.pollTimer = setTimeout(refreshDocuments, POLL_MS * 3);
    }
  }
}

let uploadCounter = 0;

async function uploadFiles() {
  const input = $("file-input");
  const files = [...input.files];
  input.value = "";
  if (!files.length) return;
  clearError();
  const failures = [];
  await Promise.all(files.map(async (file) => {
    const name = `u${++uploadCounter}`;
    state.uploading.set(name, file.name);
    renderDocuments();
    const form = new FormData();
    form.append("file", file, file.name);
    try {
      const accepted = await api("/v1/documents", { method: "POST", form });
      state.autoSelect.add(accepted.document_id);
    } catch (err) {
      const reason = friendly(err);  // the server's message often names the file already
      failures.push(reason.startsWith(file.name) ? reason : `${file.name}: ${reason}`);
    } finally {
      state.uploading.delete(name);
    }
  }));
  if (failures.length) showError(`Upload failed. ${failures.join(" ")}`);
  await refreshDocuments();
}

// -- validate -----------------------------------------------------------------
// The results of an earlier question, gone: under a new question's error they would read as its answer.
function clearResults() {
  state.validation = null;
  state.verdicts.clear();
  state.searched = new Set();
  revokeThumbnails();
  $("result-list").replaceChildren();
  $("results").hidden = true;
}

function readForm() {
  const question = $("question").value.trim();
  const answer = $("answer").value.trim();
  const reranker = $("reranker").value;
  const body = { question, answer, document_ids: [...state.selected], reranker };
  const problems = [];
  if (!body.document_ids.length) {
    const pending = state.documents.filter((d) => d.status === "queued" || d.status === "indexing");
    problems.push(pending.length
      ? `Select a document: ${pending.map((d) => d.document_id).join(", ")} is still indexing, wait until it is ready.`
      : state.documents.length ? "Select at least one ready document." : "Upload a PDF first, then select it.");
  }
  if (!question) problems.push("Type the question.");
  const thresholdRaw = $("threshold").value.trim();
  if (reranker === "classifier" && thresholdRaw !== "") {
    const t = Number(thresholdRaw);
    if (!Number.isFinite(t) || t < 0 || t > 1) problems.push("The threshold is a probability between 0 and 1.");
    else body.threshold = t;
  }
  const topKRaw = $("top-k").value.trim();
  if (topKRaw !== "") {
    const k = Number(topKRaw);
    if (!Number.isInteger(k) || k < 1) problems.push("Candidate pages must be a whole number of at least 1.");
    else body.top_k = k;
  }
  return { body, problems };
}

async function validate(event) {
  event.preventDefault();
  clearError();
  const { body, problems } = readForm();
  if (problems.length) {
    showError(problems.join(" "));
    clearResults();
    return;
  }
  const button = $("validate-button");
  button.disabled = true;
  button.textContent = "Validating…";
  try {
    const result = await api("/v1/validate", { method: "POST", json: body });
    state.validation = result;
    state.verdicts.clear();
    state.searched = new Set(body.document_ids);
    state.terms = keywords(`${body.question} ${body.answer}`);
    renderResults(result);
  } catch (err) {
    showError(friendly(err));
    clearResults();
    if (err.code === "document_not_ready" || err.code === "document_not_found") refreshDocuments();
  } finally {
    button.disabled = false;
    button.textContent = "Validate";
  }
}

// Which step produced the order the analyst sees: the reranker, or (when it fell
// back, or is "none") the first stage.
function rankedBy(result) {
  if (result.reranker !== "none" && !result.fallback_reason) return result.reranker;
  return result.stage || "bm25";
}

const STAGE_SCORES = { bm25: "BM25 score", dense: "similarity", hybrid: "fused rank score", cosine: "similarity" };

function formatScore(page, result) {
  if (page.probability !== null && page.probability !== undefined) {
    return `probability ${page.probability.toFixed(2)}`;
  }
  const by = rankedBy(result);
  if (by === "llm") return `LLM rank ${Math.round(1 / page.score)}`;
  // a fused rank score is about 1/(60 + rank): 0.0328, 0.0323 ... all read 0.03 at two decimals
  return `${STAGE_SCORES[by] || "score"} ${page.score.toFixed(by === "hybrid" ? 4 : 2)}`;
}

// What the score on each card is, said once above the cards (and on each score, on hover).
function scoreHelp(result) {
  const by = rankedBy(result);
  if (by === "classifier") {
    const t = result.threshold !== null && result.threshold !== undefined
      ? ` Pages below ${result.threshold} were left out (the threshold).` : "";
    return "Probability that the page supports the answer: of pages given 0.30, about 30 % do." + t;
  }
  if (by === "llm") return "The LLM kept these pages and put them in this order, best first.";
  if (by === "cosine") {
    return "Similarity of the page to the question and answer by the untrained base model. It orders the " +
      "pages; it is not a probability.";
  }
  if (by === "hybrid") {
    return "Fused rank score: the page's places in the keyword (BM25) and meaning (dense) searches, " +
      "combined. It orders the pages; it is not a probability.";
  }
  if (by === "dense") return "Similarity of the page's meaning to the question and answer. It orders the pages; " +
    "it is not a probability.";
  return "BM25 score: how strongly the page holds the question's and answer's words. It orders this search's " +
    "pages; it is not a probability.";
}

// A fallback reason in plain words: the first clause, without library detail.
function plainReason(reason) {
  const text = String(reason || "").replace(/; first-stage order returned$/, "");
  if (/api key|api_key|OPENAI_API_KEY/i.test(text)) {
    return "no API key is configured for the LLM (the server's EVIDENTIA_LLM_API_KEY)";
  }
  if (/timed out|timeout|deadline/i.test(text)) return "the LLM did not answer in time";
  if (/connection/i.test(text)) return "the LLM server could not be reached";
  if (/429|rate/i.test(text)) return "the LLM service is rate-limiting requests";
  return text;
}

function renderResults(result) {
  revokeThumbnails();
  const n = result.pages.length;
  const total = result.timings_ms && result.timings_ms.total;
  $("results-summary").textContent = `${n} ${n === 1 ? "page" : "pages"} · ranked by ${rankedBy(result)}` +
    (total !== undefined ? ` · ${Math.round(total)} ms` : "") +
    (result.threshold !== null && result.threshold !== undefined ? ` · threshold ${result.threshold}` : "") +
    // the model's name (or registry version) only: the full id (date, data hash) broke the line
    (result.model_version ? ` · model ${result.model_version.split("@")[0]}` : "");
  $("results-summary").title = result.model_version ? `model ${result.model_version}` : "";
  const fallback = $("fallback");
  if (result.fallback_reason) {
    const label = result.reranker === "llm" ? "The LLM reranker could not rank these pages"
      : `The ${result.reranker} reranker failed`;
    fallback.textContent = `${label}: ${plainReason(result.fallback_reason)}. They are shown in ` +
      `${(result.stage || "bm25").toUpperCase()} order instead.`;
    fallback.title = result.fallback_reason;  // the full technical reason, on hover
    fallback.hidden = false;
  } else {
    fallback.hidden = true;
    fallback.textContent = "";
  }
  // why the hybrid stage searched with BM25 (a document without page embeddings), as the API and the CLI say
  $("stage-note").textContent = result.stage_note || "";
  $("stage-note").hidden = !result.stage_note;
  $("score-help").textContent = n ? scoreHelp(result) : "";
  $("score-help").hidden = !n;
  $("no-results").hidden = n > 0;
  if (n === 0 && result.note) $("no-results").textContent = result.note;
  const items = result.pages.map((page, i) => resultItem(page, i + 1, result));
  $("result-list").replaceChildren(...items);
  $("results").hidden = false;
  loadThumbnails(items);
}

function resultItem(page, rank, result) {
  const li = document.createElement("li");
  li.className = "result";
  li.dataset.documentId = page.document_id;
  li.dataset.page = String(page.page);

  const thumb = document.createElement("button");
  thumb.type = "button";
  thumb.className = "thumb";
  thumb.title = "Open a larger view";
  thumb.setAttribute("aria-label", `Open page ${page.page} of ${page.document_id}`);
  const img = document.createElement("img");
  img.alt = `Page ${page.page} of ${page.document_id}`;
  img.className = "thumb-img";
  const placeholder = document.createElement("span");
  placeholder.className = "thumb-status muted";
  placeholder.textContent = "rendering…";
  thumb.append(img, placeholder);
  const judged = pageVerdict(page);
  thumb.addEventListener("click", () => openViewer(page, judged));

  const body = document.createElement("div");
  body.className = "result-body";
  const meta = document.createElement("div");
  meta.className = "result-meta";
  const rankEl = document.createElement("span");
  rankEl.className = "rank";
  rankEl.textContent = `#${rank}`;
  const where = document.createElement("button");
  where.type = "button";
  where.className = "link where";
  where.textContent = `${page.document_id} · page ${page.page}`;
  where.addEventListener("click", () => openViewer(page, judged));
  const score = document.createElement("span");
  score.className = "score";
  score.textContent = formatScore(page, result);
  score.title = scoreHelp(result);
  meta.append(rankEl, where, score);
  const doc = state.documents.find((d) => d.document_id === page.document_id);
  if (doc && doc.ocr_pages) addSourceBadge(meta, page);

  const snippet = document.createElement("p");
  snippet.className = "snippet";
  appendHighlighted(snippet, page.snippet, state.terms);

  const verdict = verdictView(judged);

  body.append(meta, snippet, verdict);
  li.append(thumb, body);
  return li;
}

// One verdict per result card. Its buttons are on the card and, while the page is open
// there, in the larger view: either sends it, both show what was recorded; and what
// analysts said of the page for this question before (earlier validations).
function newVerdict(page) {
  return { page, views: [], chosen: null, busy: false, status: "", statusClass: "verdict-status",
           earlier: earlierText(page.earlier_verdicts || []) };
}

// The verdict of a page for the last validation: its card's for a page it returned, one of
// its own for any other page of a document it searched (opened with the larger view's
// previous / next page: the evidence an analyst finds by reading further is worth a verdict).
function pageVerdict(page) {
  const key = `${page.document_id} ${page.page}`;
  if (!state.verdicts.has(key)) state.verdicts.set(key, newVerdict(page));
  return state.verdicts.get(key);
}

function earlierText(verdicts) {
  if (!verdicts.length) return "";
  const said = verdicts.map((v) => `${v.relevant ? "relevant" : "not relevant"}` +
    ` (${v.analyst || "unsigned"}, ${new Date(v.created).toLocaleDateString()})`);
  return `Judged before for this question: ${said.join("; ")}`;
}

function verdictView(judged) {
  const box = document.createElement("div");
  box.className = "verdict";
  const yes = document.createElement("button");
  yes.type = "button";
  yes.className = "verdict-yes";
  yes.textContent = "✓ Relevant";
  const no = document.createElement("button");
  no.type = "button";
  no.className = "verdict-no";
  no.textContent = "✗ Not relevant";
  const status = document.createElement("span");
  status.setAttribute("role", "status");
  const earlier = document.createElement("span");
  earlier.className = "verdict-earlier muted small";
  earlier.textContent = judged.earlier;
  earlier.hidden = !judged.earlier;
  yes.addEventListener("click", () => sendFeedback(judged, true));
  no.addEventListener("click", () => sendFeedback(judged, false));
  box.append(yes, no, status, earlier);
  judged.views.push({ box, yes, no, status });
  paintVerdict(judged);
  return box;
}

function paintVerdict(judged) {
  for (const { yes, no, status } of judged.views) {
    yes.disabled = no.disabled = judged.busy;
    yes.classList.toggle("chosen", judged.chosen === true);
    no.classList.toggle("chosen", judged.chosen === false);
    yes.setAttribute("aria-pressed", String(judged.chosen === true));
    no.setAttribute("aria-pressed", String(judged.chosen === false));
    status.className = judged.statusClass;
    status.textContent = judged.status;
  }
}

async function sendFeedback(judged, relevant) {
  const validation = state.validation;
  if (!validation) return;
  const { page } = judged;
  Object.assign(judged, { busy: true, statusClass: "verdict-status muted", status: "saving…" });
  paintVerdict(judged);
  const analyst = sessionStorage.getItem(ANALYST_STORE) || null;
  try {
    await api("/v1/feedback", {
      method: "POST",
      json: { validation_id: validation.validation_id, document_id: page.document_id, page: page.page, relevant, analyst },
    });
    if (state.validation !== validation) return;
    Object.assign(judged, { chosen: relevant, statusClass: "verdict-status ok",
                            status: `Recorded: ${relevant ? "relevant" : "not relevant"}` });
  } catch (err) {
    Object.assign(judged, { statusClass: "verdict-status error-text", status: `Not recorded: ${friendly(err)}` });
  } finally {
    judged.busy = false;
    paintVerdict(judged);
  }
}

// A badge saying a page's text was read by OCR (with Tesseract's confidence) or
// not read at all: the analyst should check such text against the image.
function sourceBadge(data) {
  if (data.text_source !== "ocr" && data.text_source !== "unread") return null;
  const badge = document.createElement("span");
  badge.className = `badge badge-${data.text_source}`;
  if (data.text_source === "ocr") {
    const conf = data.ocr_confidence == null ? "" : ` ${Math.round(data.ocr_confidence)}%`;
    badge.textContent = `OCR${conf}`;
    badge.title = "Text read from the page image by OCR" +
      (data.ocr_confidence == null ? "" : `, mean word confidence ${data.ocr_confidence.toFixed(1)}%`) +
      ": check it against the image.";
  } else {
    badge.textContent = "not read";
    badge.title = "A scanned page whose text could not be read (OCR off or unavailable): it cannot be found by search.";
  }
  return badge;
}

async function addSourceBadge(container, page) {
  try {
    const data = await api(`${docPath(page.document_id)}/pages/${page.page}`);
    const badge = sourceBadge(data);
    if (badge) container.append(badge);
  } catch (err) {
    // the badge is a hint; the card works without it
  }
}

// -- page images ----------------------------------------------------------------
function pngUrl(page, width) {
  const params = new URLSearchParams({ width: String(width) });
  const highlight = state.terms.join(" ").slice(0, 500);
  if (highlight) params.set("highlight", highlight);
  return `${docPath(page.document_id)}/pages/${page.page}.png?${params}`;
}

async function fetchImage(page, width) {
  const blob = await api(pngUrl(page, width), { as: "blob" });
  const url = URL.createObjectURL(blob);
  state.objectUrls.add(url);
  return url;
}

function revokeThumbnails() {
  for (const url of state.objectUrls) URL.revokeObjectURL(url);
  state.objectUrls.clear();
}

function loadThumbnails(items) {
  const validation = state.validation;
  const queue = items.map((li) => li);
  const worker = async () => {
    while (queue.length && state.validation === validation) {
      const li = queue.shift();
      const img = li.querySelector(".thumb-img");
      const status = li.querySelector(".thumb-status");
      try {
        const url = await fetchImage({ document_id: li.dataset.documentId, page: Number(li.dataset.page) },
          THUMB_WIDTH);
        if (state.validation !== validation) return;
        img.addEventListener("load", () => { status.remove(); li.classList.add("loaded"); }, { once: true });
        img.src = url;
      } catch (err) {
        status.textContent = "no image";
        status.title = friendly(err);
      }
    }
  };
  for (let i = 0; i < THUMB_CONCURRENCY; i++) worker();
}

// -- larger view --------------------------------------------------------------
let viewerToken = 0;

function detachViewerVerdict() {
  const judged = state.viewerVerdict;
  if (judged) judged.views = judged.views.filter((v) => !$("viewer-verdict").contains(v.box));
  state.viewerVerdict = null;
  $("viewer-verdict").replaceChildren();
}

async function openViewer(page, judged) {
  const token = ++viewerToken;
  const dialog = $("viewer");
  detachViewerVerdict();
  if (judged) {
    state.viewerVerdict = judged;
    $("viewer-verdict").append(verdictView(judged));
  }
  state.viewerPage = { document_id: page.document_id, page: page.page };
  const doc = state.documents.find((d) => d.document_id === page.document_id);
  $("viewer-prev").disabled = page.page <= 1;
  $("viewer-next").disabled = !(doc && doc.pages > page.page);
  $("viewer-title").textContent = `${page.document_id} · page ${page.page}`;
  const img = $("viewer-img");
  img.removeAttribute("src");
  img.alt = `Page ${page.page} of ${page.document_id}`;
  img.hidden = true;
  $("viewer-img-status").textContent = "Rendering the page…";
  $("viewer-img-status").hidden = false;
  const text = $("viewer-text");
  text.replaceChildren();
  text.textContent = "Loading the text…";
  if (!dialog.open) dialog.showModal();

  fetchImage(page, LARGE_WIDTH).then((url) => {
    if (token !== viewerToken) return;
    img.src = url;
    img.hidden = false;
    $("viewer-img-status").hidden = true;
  }).catch((err) => {
    if (token === viewerToken) $("viewer-img-status").textContent = `No image: ${friendly(err)}`;
  });
  try {
    const data = await api(`${docPath(page.document_id)}/pages/${page.page}`);
    if (token !== viewerToken) return;
    text.replaceChildren();
    const badge = sourceBadge(data);
    if (badge) $("viewer-title").append(" ", badge);
    if (!data.text) {
      text.textContent = data.text_source === "unread"
        ? "(a scanned page whose text was not read: OCR is off or Tesseract is not installed)"
        : "(this page has no text: a blank page)";
    } else appendHighlighted(text, reflowed(data.text), state.terms);
  } catch (err) {
    if (token === viewerToken) text.textContent = `The text could not be loaded: ${friendly(err)}`;
  }
}

// The previous or next page of the document open in the larger view, with a verdict of its
// own while a validation searched that document.
function stepViewer(delta) {
  const open = state.viewerPage;
  if (!open) return;
  const page = { document_id: open.document_id, page: open.page + delta, earlier_verdicts: [] };
  if (page.page < 1) return;
  openViewer(page, state.validation && state.searched.has(page.document_id) ? pageVerdict(page) : null);
}

function closeViewer() {
  viewerToken++;
  state.viewerPage = null;
  detachViewerVerdict();
  const dialog = $("viewer");
  if (dialog.open) dialog.close();
}

// -- wiring -------------------------------------------------------------------
function init() {
  $("login-form").addEventListener("submit", signIn);
  $("logout").addEventListener("click", () => signOut());
  $("banner-close").addEventListener("click", clearError);
  $("file-input").addEventListener("change", uploadFiles);
  $("validate-form").addEventListener("submit", validate);
  $("reranker").addEventListener("change", syncThreshold);
  $("viewer-close").addEventListener("click", closeViewer);
  $("viewer-prev").addEventListener("click", () => stepViewer(-1));
  $("viewer-next").addEventListener("click", () => stepViewer(1));
  // the arrow keys turn the pages too, as in a PDF viewer
  $("viewer").addEventListener("keydown", (e) => {
    const button = { ArrowLeft: "viewer-prev", ArrowRight: "viewer-next" }[e.key];
    if (button && !$(button).disabled) {
      e.preventDefault();
      $(button).click();
    }
  });
  $("viewer").addEventListener("click", (e) => { if (e.target === $("viewer")) closeViewer(); });
  $("viewer").addEventListener("close", () => { viewerToken++; detachViewerVerdict(); });

  const key = sessionStorage.getItem(KEY_STORE);
  if (!key) {
    signOut();
    return;
  }
  api("/v1/documents", { key }).then((list) => {
    state.key = key;
    enterWorkspace(list.documents);
  }).catch((err) => {
    signOut(err.status === 401 ? `Your API key is no longer accepted: ${err.message}` : friendly(err));
  });
}

init();
