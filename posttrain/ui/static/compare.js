// The compare page, "/compare?runs=a,b,c": up to 8 runs side by side.
//
// Verdicts in one table, every default curve with one line per run, the settings whose
// values differ across the runs (one column per run), and the runs grouped by one of
// those settings (a seed study or a learning-rate grid reads as one row per value, with
// the mean delta of its runs). Finished runs do not change, so the page reads once.

import { ChartGroup, LineChart } from "./chart.js";
import {
  fill, fmtInterval, fmtRate, fmtSigned, getJSON, h, isNumber, statusPill, verdictPill,
} from "./common.js";
import { DEFAULT_CHARTS } from "./metrics.js";
import { flatten, showValue } from "./results.js";

export const MAX_RUNS = 8;
// eight colours a reader can tell apart on white (the run page's two come first)
export const PALETTE = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626", "#0891b2",
  "#ca8a04", "#4b5563"];
const MAX_POINTS = 2000;
// settings every run records but that say nothing about how it differs
const IGNORED_SETTINGS = new Set(["run_name", "settings.run_name", "versions.python"]);

const $ = (id) => document.getElementById(id);
const group = new ChartGroup();

function runLink(name) {
  return h("a", { href: `/runs/${encodeURIComponent(name)}` }, name);
}

/** The run names of the query string, checked: 2 to 8 distinct names. */
export function requestedRuns(search) {
  const raw = new URLSearchParams(search).get("runs") || "";
  const names = [...new Set(raw.split(",").map((n) => n.trim()).filter(Boolean))];
  if (names.length < 2) return { names, problem: "Select at least two runs on the run list to compare them." };
  if (names.length > MAX_RUNS) {
    return { names, problem: `${names.length} runs selected; the compare page shows at most ${MAX_RUNS}.` };
  }
  return { names, problem: null };
}

function showProblem(text) {
  $("problem").hidden = false;
  $("problem-text").textContent = text;
}

// --- verdicts -------------------------------------------------------------------------------

function verdictRow(run, colour) {
  const summary = run.summary || {};
  const delta = summary.delta || {};
  const before = summary.before || {};
  const after = summary.after || {};
  const config = run.config || {};
  const settings = config.settings || {};
  return h("tr", { dataset: { run: run.name } },
    h("td", {}, h("span", { className: "swatch", style: { background: colour } }), runLink(run.name)),
    h("td", {}, config.recipe || "–"),
    h("td", {}, statusPill(run)),
    h("td", { className: "mono" }, settings.base_model || config.base_model || "–"),
    h("td", { className: "num" }, isNumber(before.pass_at_1) ? fmtRate(before.pass_at_1) : "–"),
    h("td", { className: "num" }, isNumber(after.pass_at_1) ? fmtRate(after.pass_at_1) : "–"),
    h("td", { className: "num" }, isNumber(delta.delta)
      ? `${fmtSigned(delta.delta)} ${fmtInterval(delta.ci95, true)}` : "–"),
    h("td", {}, verdictPill(delta.verdict || summary.verdict) || "–"));
}

function verdictTable(runs) {
  return h("table", { className: "data", id: "verdicts" },
    h("thead", {}, h("tr", {}, ["run", "recipe", "status", "base model", "pass@1 before",
      "pass@1 after", "delta [95%]", "verdict"].map((t) => h("th", {}, t)))),
    h("tbody", {}, runs.map((run, i) => verdictRow(run, PALETTE[i]))));
}

// --- settings that differ, and groups ----------------------------------------------------------

/** Keys whose values are not the same in every run: [[key, [value per run]], ...]. */
export function differingSettings(configs) {
  const flat = configs.map((config) => new Map(flatten(config)));
  const keys = new Set();
  for (const map of flat) for (const key of map.keys()) keys.add(key);
  const rows = [];
  for (const key of [...keys].sort()) {
    if (IGNORED_SETTINGS.has(key)) continue;
    const values = flat.map((map) => map.get(key));
    const shown = values.map((v) => JSON.stringify(v === undefined ? null : v));
    if (new Set(shown).size > 1) rows.push([key, values]);
  }
  return rows;
}

function configDiffTable(names, rows) {
  if (!rows.length) return h("p", { className: "muted" }, "All runs have the same settings.");
  return h("table", { className: "data", id: "config-diff" },
    h("thead", {}, h("tr", {}, h("th", {}, "setting"), names.map((n) => h("th", { className: "mono" }, n)))),
    h("tbody", {}, rows.map(([key, values]) => h("tr", { dataset: { key } },
      h("td", { className: "mono" }, key),
      values.map((v) => h("td", { className: "mono" }, showValue(v)))))));
}

/** Runs grouped by the value of `key`: [{value, runs, meanDelta, verdicts}] in value order. */
export function groupRuns(runs, key) {
  const groups = new Map();
  for (const run of runs) {
    const value = new Map(flatten(run.config || {})).get(key);
    const label = showValue(value);
    if (!groups.has(label)) groups.set(label, { value: label, raw: value, runs: [] });
    groups.get(label).runs.push(run);
  }
  const out = [...groups.values()].map((g) => {
    const deltas = g.runs.map((r) => ((r.summary || {}).delta || {}).delta).filter(isNumber);
    return {
      ...g,
      meanDelta: deltas.length ? deltas.reduce((a, b) => a + b, 0) / deltas.length : null,
      verdicts: g.runs.map((r) => ((r.summary || {}).delta || {}).verdict || (r.summary || {}).verdict || "–"),
    };
  });
  out.sort((a, b) => (typeof a.raw === "number" && typeof b.raw === "number"
    ? a.raw - b.raw : String(a.value).localeCompare(String(b.value))));
  return out;
}

function groupsTable(runs, key) {
  const groups = groupRuns(runs, key);
  return h("table", { className: "data", id: "groups" },
    h("thead", {}, h("tr", {}, [key, "runs", "mean delta", "verdicts"].map((t) => h("th", {}, t)))),
    h("tbody", {}, groups.map((g) => h("tr", { dataset: { value: g.value } },
      h("td", { className: "mono" }, g.value),
      h("td", {}, g.runs.map((r, i) => [i ? ", " : "", runLink(r.name)])),
      h("td", { className: "num" }, isNumber(g.meanDelta) ? fmtSigned(g.meanDelta) : "–"),
      h("td", {}, g.verdicts.join(", "))))));
}

// --- curves -------------------------------------------------------------------------------------

async function fetchCurves(run, metrics) {
  const wanted = metrics.filter((m) => run.metric_names.includes(m));
  if (!wanted.length) return {};
  const query = new URLSearchParams({ names: wanted.join(","), max_points: String(MAX_POINTS) });
  const { status, data } = await getJSON(`/api/runs/${encodeURIComponent(run.name)}/metrics?${query}`);
  return status === 200 ? data.series : {};
}

async function drawCurves(runs) {
  const available = new Set(runs.flatMap((run) => run.metric_names || []));
  const shown = DEFAULT_CHARTS.filter(([name]) => available.has(name));
  const metrics = shown.map(([name]) => name);
  const curves = await Promise.all(runs.map((run) => fetchCurves(run, metrics)));
  const box = $("charts");
  for (const [metric, title, help] of shown) {
    const chart = group.add(new LineChart(group, { metric, title, help }));
    box.append(chart.element);
    const series = [];
    runs.forEach((run, i) => {
      const curve = curves[i][metric];
      if (curve && curve.steps.length) {
        series.push({ id: i === 0 ? "main" : `run-${i}`, label: run.name, color: PALETTE[i],
          steps: curve.steps, values: curve.values });
      }
    });
    chart.setSeries(series, false);
  }
  fill($("legend"), runs.map((run, i) => h("span", {},
    h("span", { className: "swatch", style: { background: PALETTE[i] } }), run.name)));
  $("curves-panel").hidden = !shown.length;
  group.drawAll();
}

// --- the page -------------------------------------------------------------------------------------

async function main() {
  const { names, problem } = requestedRuns(window.location.search);
  $("run-count").textContent = `· ${names.length} runs`;
  if (problem) {
    showProblem(problem);
    $("connection").textContent = "";
    document.documentElement.dataset.ready = "1";
    return;
  }
  const answers = await Promise.all(names.map((name) =>
    getJSON(`/api/runs/${encodeURIComponent(name)}`)));
  const missing = names.filter((_, i) => answers[i].status !== 200);
  const runs = answers.filter((a) => a.status === 200).map((a) => a.data);
  if (missing.length) showProblem(`No run named ${missing.join(", ")} in this store; showing the others.`);
  if (runs.length) {
    fill($("verdicts-box"), verdictTable(runs));
    $("verdicts-panel").hidden = false;
    const rows = differingSettings(runs.map((run) => run.config || {}));
    fill($("config-box"), configDiffTable(runs.map((r) => r.name), rows));
    const select = $("group-by");
    const keys = rows.map(([key]) => key);
    const preferred = keys.find((k) => k.endsWith(".seed")) || keys[0];
    fill(select, keys.map((key) => h("option", { value: key, selected: key === preferred }, key)));
    const regroup = () => {
      if (select.value) fill($("groups-box"), groupsTable(runs, select.value));
      else fill($("groups-box"), h("p", { className: "muted" }, "No setting differs."));
    };
    select.addEventListener("change", regroup);
    regroup();
    $("config-panel").hidden = false;
    await drawCurves(runs);
  }
  $("smoothing").addEventListener("input", (event) => group.setSmoothing(Number(event.target.value)));
  $("connection").textContent = "";
  document.documentElement.dataset.ready = "1";
}

main().catch((error) => {
  showProblem(`Could not load the runs: ${error.message}`);
  document.documentElement.dataset.ready = "1";
});
