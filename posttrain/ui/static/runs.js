// The run list at "/": every run in the store, newest first, refreshed every 2 seconds.
//
// A finished run's headline delta comes with its interval, read once from the run's own
// record (/api/runs/<name>) and cached: a finished run does not change unless it is
// started again under the same name, which changes its start time and so the cache key.

import {
  fill, fmtAgo, fmtDate, fmtDuration, fmtInt, fmtInterval, fmtSigned, getJSON, h, isNumber,
  serverNow, statusPill, verdictFamily, verdictPill,
  errorText,
} from "./common.js";

const POLL_MS = 2000;
const MAX_COMPARED = 8; // the compare page's limit
const selected = new Set();
const intervals = new Map(); // `${name}@${started}` -> delta interval (or null)
let runs = [];
let lastPayload = "";

const body = document.getElementById("runs-body");
const filterBox = document.getElementById("filter");
const compareButton = document.getElementById("compare");
const countLabel = document.getElementById("count");
const emptyNote = document.getElementById("empty");
const connection = document.getElementById("connection");

function runLink(name) {
  return `/runs/${encodeURIComponent(name)}`;
}

function stepsCell(run) {
  const step = run.last_step;
  const total = run.total_steps;
  const text = isNumber(total) ? `${fmtInt(step)} / ${fmtInt(total)}` : fmtInt(step);
  const cell = h("td", { className: "num" }, text);
  if (run.status === "running" && isNumber(total) && total > 0 && isNumber(step)) {
    const share = Math.min(1, Math.max(0, (step + 1) / total));
    const bar = h("div", { className: "minibar" }, h("span", {}));
    bar.firstChild.style.width = `${(share * 100).toFixed(1)}%`;
    cell.append(bar);
    if (isNumber(run.eta) && isNumber(run.updated)) {
      const left = Math.max(0, run.eta - (serverNow() - run.updated));
      cell.append(h("div", { className: "faint" }, `ETA ${fmtDuration(left)}`));
    }
  }
  return cell;
}

function deltaCell(run) {
  if (!isNumber(run.headline_delta)) {
    const why = run.status === "running" ? "while training" : "no after-evaluation";
    return h("td", { className: "faint" }, run.status === "running" ? "…" : "–", " ",
      h("span", { className: "faint" }, why));
  }
  const family = verdictFamily(run.verdict);
  const interval = intervals.get(`${run.name}@${run.started}`);
  return h("td", { className: "delta-cell num" },
    h("span", { className: `text-${family === "none" ? "flat" : family}` }, fmtSigned(run.headline_delta)),
    " ",
    interval ? h("span", { className: "interval" }, fmtInterval(interval, true)) : null,
    " ",
    verdictPill(run.verdict));
}

function row(run) {
  const box = h("input", {
    type: "checkbox", checked: selected.has(run.name), title: "select to compare",
    onchange: (event) => {
      if (event.target.checked) selected.add(run.name);
      else selected.delete(run.name);
      updateCompareButton();
    },
  });
  return h("tr", { dataset: { run: run.name, status: run.status } },
    h("td", {}, box),
    h("td", { className: "name" }, h("a", { href: runLink(run.name) }, run.name)),
    h("td", {}, statusPill(run)),
    h("td", { className: "mono" }, run.base_model || "–"),
    h("td", { className: "num", title: fmtDate(run.started) }, fmtAgo(run.started)),
    stepsCell(run),
    deltaCell(run));
}

function updateCompareButton() {
  for (const name of [...selected]) {
    if (!runs.some((run) => run.name === name)) selected.delete(name);
  }
  const ready = selected.size >= 2 && selected.size <= MAX_COMPARED;
  compareButton.disabled = !ready;
  compareButton.textContent = ready ? `Compare the ${selected.size} selected runs`
    : selected.size > MAX_COMPARED ? `Compare: at most ${MAX_COMPARED} runs (${selected.size} selected)`
      : `Compare: select 2 to ${MAX_COMPARED} runs (${selected.size} selected)`;
}

function render() {
  const wanted = filterBox.value.trim().toLowerCase();
  const shown = runs.filter((run) => !wanted || run.name.toLowerCase().includes(wanted));
  fill(body, shown.map(row));
  emptyNote.hidden = runs.length > 0;
  countLabel.textContent = runs.length
    ? `${shown.length} of ${runs.length} runs · ${runs.filter((r) => r.status === "running").length} running`
    : "";
  updateCompareButton();
}

async function loadIntervals() {
  // one request per finished run, once: the list API carries the delta but not its interval
  const missing = runs.filter((run) => isNumber(run.headline_delta) &&
    !intervals.has(`${run.name}@${run.started}`));
  await Promise.all(missing.map(async (run) => {
    const key = `${run.name}@${run.started}`;
    intervals.set(key, null);
    try {
      const { status, data } = await getJSON(`/api/runs/${encodeURIComponent(run.name)}`);
      const delta = status === 200 ? (data.summary || {}).delta : null;
      intervals.set(key, delta && Array.isArray(delta.ci95) ? delta.ci95 : null);
    } catch (error) {
      intervals.delete(key);
    }
  }));
  if (missing.length) render();
}

async function poll() {
  if (document.hidden) return;
  try {
    const { status, data } = await getJSON("/api/runs");
    if (status !== 200) {  // the server answered: say what it said (e.g. a damaged store)
      connection.textContent = errorText(data, status);
      connection.className = "conn lost";
      return;
    }
    connection.textContent = "live";
    connection.className = "conn";
    const payload = JSON.stringify(data.runs);
    // re-render on new data, and every poll anyway so "ago" times and ETAs move on
    runs = data.runs;
    if (payload !== lastPayload) {
      lastPayload = payload;
      loadIntervals();
    }
    render();
    document.documentElement.dataset.loaded = "1";
  } catch (error) {
    connection.textContent = `server unreachable (${error.message}); retrying`;
    connection.className = "conn lost";
  }
}

filterBox.addEventListener("input", render);
compareButton.addEventListener("click", () => {
  const names = [...selected];
  // two runs: the run page with the other run overlaid; more: the compare page
  window.location.href = names.length === 2
    ? `${runLink(names[0])}?compare=${encodeURIComponent(names[1])}`
    : `/compare?runs=${names.map(encodeURIComponent).join(",")}`;
});
document.addEventListener("visibilitychange", () => { if (!document.hidden) poll(); });
poll();
setInterval(poll, POLL_MS);
