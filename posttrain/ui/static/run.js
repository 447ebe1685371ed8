// The run page at /runs/<name>[?compare=<other>]: headline verdict, progress with ETA,
// alarms on a timeline, live training curves, then the measured results and the config.
//
// Live updates poll the JSON API: the run record every second while the run is running
// (every 5 s once it has finished), and for the curves only the points after the last
// step already drawn (?after=<step>), so a long run costs the same per poll as a short
// one. The first load asks for at most MAX_POINTS points per curve; the server thins
// longer curves keeping each bucket's min and max. A curve that grew past twice that
// in the browser is fetched again, thinned, so the page never holds more than it draws.

import { ChartGroup, LineChart } from "./chart.js";
import {
  fill, fmtAgo, fmtDate, fmtDuration, fmtInt, getJSON, h, isNumber, postJSON, serverNow,
  statusInfo,
  statusPill,
  errorText,
} from "./common.js";
import {
  categoryTable, configTable, forestPlot, headline, keySettings, pairReport, signalReport,
  statsTable, timingsTable,
} from "./results.js";
import { DEFAULT_CHARTS } from "./metrics.js";
import { showSamples } from "./samples.js";

// two points (a bucket's min and max) per pixel column of a wide chart: more would only
// cost the server time (reading a 100,000-point curve is most of the page's load time)
const MAX_POINTS = 1000;
const POLL_RUNNING_MS = 1000;
const POLL_FINISHED_MS = 5000;
const COLOURS = { main: "#2563eb", compare: "#ea580c" };

const DEFAULT_NAMES = new Set(DEFAULT_CHARTS.map(([name]) => name));

const pathName = decodeURIComponent(window.location.pathname.replace(/^\/runs\//, ""));
const state = {
  name: pathName,
  compare: new URLSearchParams(window.location.search).get("compare") || null,
  run: null,
  compareRun: null,
  curves: { main: new Map(), compare: new Map() }, // metric -> {steps, values, times}
  xAxis: "step", // or "time": minutes since the run started
  charts: new Map(), // metric -> LineChart
  extra: new Set(), // metrics the reader added with the "more metrics" buttons
  alarmsKey: "",
  samplesKey: "",
  samplesTicket: 0, // the latest samples request; older answers are dropped
  pendingCategory: null,
  resultsKey: "",
  busy: false,
  ready: false,
};
const group = new ChartGroup();
const $ = (id) => document.getElementById(id);

// --- API ----------------------------------------------------------------------------------

async function fetchRun(name) {
  const { status, data } = await getJSON(`/api/runs/${encodeURIComponent(name)}`);
  if (status === 404) return null;
  if (status !== 200) throw new Error(errorText(data, status));
  return data;
}

async function fetchSeries(name, metrics, after = null) {
  const query = new URLSearchParams({ names: metrics.join(","), max_points: String(MAX_POINTS) });
  if (after !== null) query.set("after", String(after));
  const { status, data } = await getJSON(`/api/runs/${encodeURIComponent(name)}/metrics?${query}`);
  if (status !== 200) throw new Error(errorText(data, status));
  return data.series;
}

/**
 * Load whole curves (thinned by the server) in one request: one round trip, and the
 * server reads them one after the other anyway.
 */
async function loadFull(which, name, metrics) {
  if (!metrics.length) return;
  const curves = state.curves[which];
  const answer = await fetchSeries(name, metrics);
  for (const metric of metrics) {
    const series = answer[metric];
    curves.set(metric, { steps: series.steps, values: series.values, times: series.times });
  }
}

/** Append the points after each curve's last step; refetch curves that grew too long. */
async function loadNew(which, name, metrics) {
  const curves = state.curves[which];
  const byLast = new Map();
  const reload = [];
  for (const metric of metrics) {
    const curve = curves.get(metric);
    if (!curve) { reload.push(metric); continue; }
    const last = curve.steps.length ? curve.steps[curve.steps.length - 1] : -1;
    if (!byLast.has(last)) byLast.set(last, []);
    byLast.get(last).push(metric);
  }
  const changed = new Set(reload);
  // curves never loaded are requested first, before any await, so that the request
  // leaves while the page renders the rest
  const jobs = reload.length ? [loadFull(which, name, [...reload])] : [];
  const tooLong = [];
  jobs.push(...[...byLast].map(async ([last, names]) => {
    const answer = await fetchSeries(name, names, last);
    for (const metric of names) {
      const series = answer[metric];
      if (!series || !series.steps.length) continue;
      const curve = curves.get(metric);
      if (series.downsampled || curve.steps.length + series.steps.length > 2 * MAX_POINTS) {
        tooLong.push(metric); // too many new points to append one by one: thin the whole curve
        changed.add(metric);
        continue;
      }
      for (let i = 0; i < series.steps.length; i++) {
        if (series.steps[i] > last) {
          curve.steps.push(series.steps[i]);
          curve.values.push(series.values[i]);
          curve.times.push(series.times[i]);
        }
      }
      changed.add(metric);
    }
  }));
  await Promise.all(jobs);
  if (tooLong.length) await loadFull(which, name, tooLong);
  return changed;
}

// --- charts -------------------------------------------------------------------------------

function availableMetrics() {
  const names = new Set(state.run ? state.run.metric_names : []);
  if (state.compareRun) for (const name of state.compareRun.metric_names) names.add(name);
  return names;
}

function wantedCharts() {
  const available = availableMetrics();
  const wanted = DEFAULT_CHARTS.filter(([name]) => available.has(name));
  for (const name of state.extra) if (available.has(name)) wanted.push([name, name, ""]);
  return wanted;
}

function syncCharts() {
  const wanted = wantedCharts();
  const wantedNames = new Set(wanted.map(([name]) => name));
  for (const [metric, chart] of state.charts) {
    if (!wantedNames.has(metric)) { chart.destroy(); state.charts.delete(metric); }
  }
  const box = $("charts");
  for (const [metric, title, help] of wanted) {
    let chart = state.charts.get(metric);
    if (!chart) {
      const dataUrl = `/api/runs/${encodeURIComponent(state.name)}/metrics?` +
        new URLSearchParams({ names: metric, max_points: "100000" });
      const csvUrl = `/api/runs/${encodeURIComponent(state.name)}/metrics.csv?` +
        new URLSearchParams({ names: metric });
      chart = group.add(new LineChart(group, { metric, title, help, dataUrl, csvUrl }));
      state.charts.set(metric, chart);
    }
    box.append(chart.element); // re-appending keeps the order of `wanted`
  }
  renderMoreMetrics();
}

/** Give a chart its curves; call group.drawAll() after (all charts share one step range). */
function updateChart(metric) {
  const chart = state.charts.get(metric);
  if (!chart) return;
  const series = [];
  const main = state.curves.main.get(metric);
  if (main) {
    series.push({ id: "main", label: state.name, color: COLOURS.main, ...onAxis(main, state.run) });
  }
  const other = state.compare ? state.curves.compare.get(metric) : null;
  if (other && state.compareRun) {
    series.push({ id: "compare", label: state.compare, color: COLOURS.compare,
      ...onAxis(other, state.compareRun) });
  }
  chart.setSeries(series, false);
}

/** A curve's x positions on the chosen axis: steps, or minutes since its run started. */
function onAxis(curve, run) {
  if (state.xAxis !== "time" || !isNumber(run.started)) return { steps: curve.steps, values: curve.values };
  return { steps: curve.times.map((t) => (t - run.started) / 60), values: curve.values };
}

function alarmMarkers(run) {
  const alarms = run.alarms || [];
  if (state.xAxis === "time" && isNumber(run.started)) {
    return alarms.filter((a) => isNumber(a.time))
      .map((a) => ({ step: (a.time - run.started) / 60, label: `${a.kind}: ${a.message}` }));
  }
  return alarms.filter((a) => isNumber(a.step)).map((a) => ({ step: a.step, label: `${a.kind}: ${a.message}` }));
}

function setXAxis(axis) {
  state.xAxis = axis === "time" ? "time" : "step";
  window.localStorage.setItem("posttrain.xaxis", state.xAxis);
  group.formatX = state.xAxis === "time"
    ? (x) => `${x.toFixed(x < 10 ? 2 : 1)} min since start`
    : (x) => `step ${fmtInt(x)}`;
  document.documentElement.dataset.xAxis = state.xAxis;
  group.xRange = null;
  for (const metric of state.charts.keys()) updateChart(metric);
  if (state.run) group.setMarkers(alarmMarkers(state.run));
  group.drawAll();
}

function renderMoreMetrics() {
  const others = [...availableMetrics()].filter((name) => !DEFAULT_NAMES.has(name)).sort();
  const box = $("more-metrics");
  if (!others.length) { box.replaceChildren(); return; }
  fill(box, h("span", { className: "muted" }, "More metrics: "),
    others.map((name) => h("button", {
      className: state.extra.has(name) ? "on" : "",
      onclick: async () => {
        if (state.extra.has(name)) state.extra.delete(name);
        else state.extra.add(name);
        syncCharts();
        await refreshCurves();
      },
    }, state.extra.has(name) ? `− ${name}` : `+ ${name}`)));
}

function renderLegend() {
  const items = [h("span", {}, h("span", { className: "swatch", style: { background: COLOURS.main } }), state.name)];
  if (state.compare) {
    items.push(h("span", {}, h("span", { className: "swatch", style: { background: COLOURS.compare } }),
      state.compare));
  }
  items.push(h("span", {}, h("span", { className: "swatch alarm" }), "alarm"));
  fill($("legend"), items);
}

/** Fetch what is new for every shown chart (both runs) and redraw the charts that changed. */
async function refreshCurves() {
  const metrics = [...state.charts.keys()];
  const jobs = [];
  const mainNames = metrics.filter((m) => state.run.metric_names.includes(m));
  jobs.push(loadNew("main", state.name, mainNames));
  if (state.compareRun) {
    const compareNames = metrics.filter((m) => state.compareRun.metric_names.includes(m));
    const compareLive = state.compareRun.status === "running" ||
      compareNames.some((m) => !state.curves.compare.has(m));
    if (compareLive) jobs.push(loadNew("compare", state.compare, compareNames));
  }
  const changed = new Set();
  for (const names of await Promise.all(jobs)) for (const name of names) changed.add(name);
  for (const metric of changed) updateChart(metric);
  if (changed.size) group.drawAll();
}

// --- progress, alarms, notes -------------------------------------------------------------------

function renderProgress(run) {
  const progress = run.progress || {};
  const step = progress.step;
  const total = progress.total;
  const bar = $("progress");
  bar.className = `progress ${run.status}`;
  const share = isNumber(total) && total > 0 && isNumber(step) ? Math.min(1, step / total) : 0;
  bar.firstElementChild.style.width = `${(share * 100).toFixed(1)}%`;
  const parts = [h("b", {}, `step ${fmtInt(step)}`),
    isNumber(total) ? ` / ${fmtInt(total)} (${Math.round(share * 100)}%)` : ""];
  const elapsed = (isNumber(run.finished) ? run.finished : serverNow()) - run.started;
  if (run.status === "running") {
    if (isNumber(progress.eta) && isNumber(run.updated)) {
      const left = Math.max(0, progress.eta - (serverNow() - run.updated));
      parts.push(" · ETA ", h("b", { id: "eta" }, fmtDuration(left)));
    }
    parts.push(` · elapsed ${fmtDuration(elapsed)} · last heard from ${fmtAgo(run.updated)}`);
  } else if (run.status === "lost") {
    parts.push(` · last heard from ${fmtAgo(run.updated)}`);
    parts.push(h("div", { className: "text-down" }, statusInfo(run).title));
  } else {
    parts.push(` · ${run.status} ${fmtDate(run.finished)} after ${fmtDuration(elapsed)}`);
  }
  fill($("progress-text"), parts);
}

function renderAlarms(run) {
  const alarms = run.alarms || [];
  const total = (run.progress || {}).total || (run.progress || {}).step || 1;
  const timeline = $("timeline");
  timeline.hidden = !alarms.length;
  const end = h("span", { className: "axis-label end" }, `step ${fmtInt(total)}`);
  fill(timeline,
    alarms.filter((a) => isNumber(a.step)).map((alarm) => {
      const tick = h("div", { className: "tick", title: `step ${alarm.step}: ${alarm.message}` },
        h("span", {}, `${alarm.kind} alarm, step ${fmtInt(alarm.step)}`));
      tick.style.left = `${Math.min(100, (100 * alarm.step) / Math.max(1, total))}%`;
      return tick;
    }),
    h("span", { className: "axis-label" }, "step 0"), end);
  const monitored = run.metric_names.some((name) => name.startsWith("monitor/"));
  const checked = new Set((run.sample_checks || []).map((c) => c.step));
  fill($("alarms"), alarms.length ? alarms.map((alarm) => h("li", { dataset: { kind: alarm.kind } },
    h("span", { className: "kind" }, `${alarm.kind} alarm`),
    h("span", { className: "num muted" }, isNumber(alarm.step) ? `step ${alarm.step} · ` : ""),
    alarm.message,
    checked.has(alarm.step) ? [" ", h("a", { href: "#samples-panel", className: "alarm-replies",
      onclick: (event) => { event.preventDefault(); showAlarmReplies(alarm); } },
    "see the replies")] : null)) : h("li", { className: "no-alarm" }, monitored
    ? "No alarms: the hack monitor has found nothing so far."
    : "No alarms (no hack-monitor checks logged: --monitor-every 0, or before its first check)."));
  fill($("notes"), (run.notes || []).map((note) => h("li", {},
    isNumber(note.step) ? `step ${note.step}: ` : "", note.text)));
  group.setMarkers(alarmMarkers(run));
}

// --- results and config --------------------------------------------------------------------

function renderResults(run) {
  const summary = run.summary || {};
  const compareSummary = state.compareRun ? state.compareRun.summary : null;
  fill($("headline"), headline(run, state.compareRun));
  const measured = Boolean(summary.delta && summary.before && summary.after);
  $("results-panel").hidden = !measured;
  if (measured) {
    fill($("forest"), forestPlot(summary));
    fill($("stats-box"), statsTable(summary));
    fill($("categories-box"), categoryTable(summary, compareSummary));
  }
  const signal = signalReport(summary);
  $("signal-panel").hidden = !signal;
  if (signal) fill($("signal-box"), signal);
  $("pairs-panel").hidden = !summary.pair_report;
  if (summary.pair_report) fill($("pairs-box"), pairReport(summary.pair_report));
  const config = configTable(run.config || {}, state.compareRun ? state.compareRun.config : null);
  fill($("config-box"), config.element);
  fill($("key-settings"), keySettings(run.config || {}, state.compareRun ? state.compareRun.config : null));
  $("config-summary").textContent = `Every setting (${config.count})`;
  $("config-hint").textContent = state.compareRun
    ? `· ${config.differing} settings differ from ${state.compare}` : "";
  fill($("timings-box"), timingsTable(summary));
  $("config-panel").hidden = false;
}

/** The samples selector's choices: the holdout before/after (once measured) and each
 * monitor check the run store kept (also while the run trains). */
function renderSampleChoices(run, measured) {
  const checks = run.sample_checks || [];
  const key = JSON.stringify([measured, checks.map((c) => [c.source, c.step])]);
  if (key === state.samplesKey) return;
  state.samplesKey = key;
  const select = $("samples-which");
  const previous = select.value;
  const options = [];
  if (measured) {
    options.push(["after", "holdout, after training"], ["before", "holdout, before training"],
      ["compare", "holdout, before and after side by side"]);
  }
  for (const check of checks) {
    options.push([`${check.source}:${check.step}`, check.source === "monitor"
      ? `monitor check at step ${check.step}: holdout replies (${check.count})`
      : `training replies up to step ${check.step} (${check.count})`]);
  }
  fill(select, options.map(([value, label]) => h("option", { value }, label)));
  if (options.some(([value]) => value === previous)) select.value = previous;
  $("samples-panel").hidden = !options.length;
  if (options.length) refreshSamples();
}

async function refreshSamples() {
  // rows are read when the choices change (a check, the results), not on every poll
  const which = $("samples-which").value;
  const fromFolder = which === "after" || which === "before";
  $("rows-links").hidden = !fromFolder;
  if (fromFolder) {
    const base = `/api/runs/${encodeURIComponent(state.name)}/rows`;
    $("rows-json").href = `${base}.json?which=${which}`;
    $("rows-csv").href = `${base}.csv?which=${which}`;
  }
  const filters = { category: $("samples-category").value, outcome: $("samples-outcome").value,
    text: $("samples-text").value };
  const ticket = ++state.samplesTicket;
  const categories = await showSamples($("samples-box"), state.name, which, filters,
    () => ticket === state.samplesTicket);
  if (ticket !== state.samplesTicket) return; // a newer choice is being shown
  if (categories) {
    const chosen = $("samples-category").value;
    fill($("samples-category"), h("option", { value: "" }, "every category"),
      categories.map((name) => h("option", { value: name }, name)));
    $("samples-category").value = categories.includes(chosen) ? chosen : "";
  }
  document.documentElement.dataset.samples = which;
}

/** Show the replies behind an alarm: the training replies for a hack alarm (what the
 * reward paid for), the monitor's holdout replies for the others. */
function showAlarmReplies(alarm) {
  const checks = (state.run.sample_checks || []);
  const source = alarm.kind === "hack" ? "rollouts" : "monitor";
  const check = checks.find((c) => c.source === source && c.step === alarm.step)
    || checks.find((c) => c.step === alarm.step);
  if (!check) return;
  $("samples-which").value = `${check.source}:${check.step}`;
  if (alarm.details && alarm.details.category) {
    $("samples-category").value = "";
    state.pendingCategory = alarm.details.category;
  }
  refreshSamples().then(() => {
    if (state.pendingCategory) {
      $("samples-category").value = state.pendingCategory;
      state.pendingCategory = null;
      refreshSamples();
    }
  });
  $("samples-panel").scrollIntoView();
}

function renderRun() {
  const run = state.run;
  fill($("status"), statusPill(run));
  // a live run cannot be deleted (its next write would bring it back half-empty)
  $("delete-run").hidden = run.status === "running";
  $("headline-panel").hidden = false;
  $("progress-panel").hidden = false;
  $("curves-panel").hidden = false;
  renderProgress(run);
  // the rest is rebuilt only when its data changed, not on every poll
  const alarmsKey = JSON.stringify([run.alarms, run.notes, run.progress.total, run.sample_checks,
    run.metric_names.some((name) => name.startsWith("monitor/"))]);
  if (alarmsKey !== state.alarmsKey) {
    state.alarmsKey = alarmsKey;
    renderAlarms(run);
  }
  const summary = run.summary || {};
  renderSampleChoices(run, Boolean(summary.delta && summary.before && summary.after));
  const other = state.compareRun;
  const resultsKey = JSON.stringify([run.status, run.summary, run.config,
    other && [other.name, other.status, other.summary, other.config]]);
  if (resultsKey !== state.resultsKey) {
    state.resultsKey = resultsKey;
    renderResults(run);
  }
}

// --- compare selector ---------------------------------------------------------------------------

async function loadCompareChoices() {
  const { status, data } = await getJSON("/api/runs");
  if (status !== 200) return;
  const select = $("compare-select");
  const others = data.runs.filter((run) => run.name !== state.name);
  fill(select, h("option", { value: "" }, others.length ? "no other run" : "no other runs yet"),
    others.map((run) => h("option", { value: run.name, selected: run.name === state.compare },
      `${run.name} (${run.status})`)));
}

async function deleteRun() {
  const what = state.run.status === "lost" ? "this lost run" : "this run";
  if (!window.confirm(`Delete ${what} (${state.name}): its record, curves and run folder? ` +
    "This cannot be undone.")) return;
  const { status, data } = await postJSON(
    `/api/runs/${encodeURIComponent(state.name)}/delete`, { force: false });
  if (status === 200) {
    window.location.assign("/");
  } else {
    window.alert(`Not deleted: ${errorText(data, status)}`);
  }
}

async function setCompare(name) {
  state.compare = name || null;
  state.compareRun = null;
  state.curves.compare = new Map();
  const url = new URL(window.location.href);
  if (state.compare) url.searchParams.set("compare", state.compare);
  else url.searchParams.delete("compare");
  window.history.replaceState(null, "", url);
  renderLegend();
  while (state.busy) await new Promise((resolve) => setTimeout(resolve, 50)); // a poll in flight
  await tick(true);
  for (const metric of state.charts.keys()) updateChart(metric);
  group.drawAll();
}

// --- the polling loop -------------------------------------------------------------------------------

/** Whether a run exists, from the run list (asking for a missing run would log a 404 a second). */
async function runExists(name) {
  const { status, data } = await getJSON("/api/runs");
  return status === 200 && data.runs.some((run) => run.name === name);
}

async function tick(force = false) {
  if (state.busy || (document.hidden && !force)) return;
  state.busy = true;
  try {
    const missing = !$("missing").hidden;
    const [run, compareRun] = await Promise.all([
      missing && !(await runExists(state.name)) ? null : fetchRun(state.name),
      state.compare ? fetchRun(state.compare) : Promise.resolve(null),
    ]);
    $("connection").textContent = "live";
    $("connection").className = "conn";
    if (!run) {
      $("missing").hidden = false;
      $("missing-text").textContent = `No run named "${state.name}" in this store. ` +
        "This page keeps looking: it shows the run as soon as it starts.";
      document.documentElement.dataset.missing = "1";
      return;
    }
    $("missing").hidden = true;
    delete document.documentElement.dataset.missing;
    if (state.run && run.started !== state.run.started) state.curves.main = new Map(); // restarted
    state.run = run;
    state.compareRun = compareRun;
    if (!state.ready) performance.mark("posttrain:run-loaded");
    syncCharts();
    const curvesLoaded = refreshCurves(); // requests leave now; render while they travel
    renderRun();
    await curvesLoaded;
    if (!state.ready) {
      state.ready = true;
      performance.mark("posttrain:drawn");
      // read by the browser test and the benchmark: when the first full draw finished
      document.documentElement.dataset.drawMs = String(Math.round(performance.now()));
      document.documentElement.dataset.ready = "1";
    }
  } catch (error) {
    $("connection").textContent = `server unreachable (${error.message}); retrying`;
    $("connection").className = "conn lost";
  } finally {
    state.busy = false;
  }
}

function schedule() {
  const running = !state.run || state.run.status === "running" ||
    (state.compareRun && state.compareRun.status === "running");
  setTimeout(async () => {
    await tick();
    schedule();
  }, running ? POLL_RUNNING_MS : POLL_FINISHED_MS);
}

function setupControls() {
  $("samples-which").addEventListener("change", () => { refreshSamples(); });
  $("samples-category").addEventListener("change", () => { refreshSamples(); });
  $("samples-outcome").addEventListener("change", () => { refreshSamples(); });
  $("samples-text").addEventListener("input", () => { refreshSamples(); });
  const slider = $("smoothing");
  const saved = Number(window.localStorage.getItem("posttrain.smoothing"));
  if (window.localStorage.getItem("posttrain.smoothing") !== null && saved >= 0 && saved < 1) {
    slider.value = String(saved);
  }
  const apply = () => {
    const weight = Number(slider.value);
    $("smoothing-value").textContent = weight > 0 ? weight.toFixed(2) : "off";
    window.localStorage.setItem("posttrain.smoothing", String(weight));
    group.setSmoothing(weight);
  };
  slider.addEventListener("input", apply);
  apply();
  const reset = $("reset-zoom");
  const setRange = group.setXRange.bind(group);
  group.setXRange = (range) => {
    setRange(range);
    reset.hidden = range === null;
  };
  reset.addEventListener("click", () => group.setXRange(null));
  const axis = $("x-axis");
  axis.value = window.localStorage.getItem("posttrain.xaxis") === "time" ? "time" : "step";
  setXAxis(axis.value);
  axis.addEventListener("change", () => setXAxis(axis.value));
  $("compare-select").addEventListener("change", (event) => setCompare(event.target.value));
  $("delete-run").addEventListener("click", deleteRun);
  $("compare-select").addEventListener("focus", loadCompareChoices);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) tick(); });
}

$("run-name").textContent = state.name;
document.title = `${state.name} · posttrain`;
setupControls();
renderLegend();
loadCompareChoices();
tick(true).then(schedule);
