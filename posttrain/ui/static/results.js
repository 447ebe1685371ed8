// The run page's measured results, drawn from a finished run's summary (summary.json):
// the headline verdict, before/after with intervals (as a forest plot), guards and the
// noise band, the table by category with DOWN groups marked, the DPO pair report and
// the config (side by side with a compared run's).
//
// Field names follow posttrain/train/measure.py (before, after, delta, by_category_*,
// noise, pair_report, timings, trainer) and DeltaReport.to_dict() for "delta".

import {
  fmtDuration, fmtInt, fmtInterval, fmtP, fmtRate, fmtSigned, fmtValue, h, isNumber, svg,
  verdictFamily, verdictPill,
} from "./common.js";

// --- headline ----------------------------------------------------------------------------

function passLine(label, result) {
  if (!result) return null;
  return h("span", {},
    h("span", { className: "label" }, label), " ",
    h("b", { className: "num" }, fmtRate(result.pass_at_1)), " ",
    h("span", { className: "interval num" }, fmtInterval(result.ci95)));
}

function nLine(result) {
  if (!result) return "";
  const samples = isNumber(result.samples_per_prompt) ? ` x ${result.samples_per_prompt}` : "";
  return `n=${fmtInt(result.n_scenarios)} scenarios, ${fmtInt(result.n_prompts)} prompts${samples}`;
}

function noisePhrase(delta) {
  const noise = delta.noise;
  if (isNumber(delta.noise_band_used) && noise) {
    return `noise band ±${fmtRate(delta.noise_band_used)} from ${noise.n_repeats} base evaluations`;
  }
  return (noise && noise.note) || "no noise band: 1 evaluation";
}

/** The big verdict and the numbers behind it. `run` is the API's run record. */
export function headline(run, compareRun) {
  const summary = run.summary || {};
  const delta = summary.delta;
  const status = run.status;
  const box = (family, word, sub) => h("div", { className: `verdict-box verdict-${family}`, id: "verdict" },
    h("div", { className: "word" }, word), h("div", { className: "sub" }, sub));
  const parts = [];
  const numbers = []; // children of the numbers column (null entries are skipped)
  if (delta && delta.verdict) {
    const family = verdictFamily(delta.verdict);
    const okText = delta.ok === false ? "report fails: see the flags" : "pass@1 on the holdout";
    parts.push(box(family, delta.verdict, okText));
    numbers.push(
      h("div", { className: "big-line" },
        passLine("before", delta.before || summary.before), h("span", { className: "arrow" }, "→"),
        passLine("after", delta.after || summary.after)),
      h("div", { className: "big-line" },
        h("span", { className: "label" }, "delta"), " ",
        h("b", { className: `num text-${family === "none" ? "flat" : family}`, id: "headline-delta" },
          fmtSigned(delta.delta)), " ",
        h("span", { className: "interval num" }, fmtInterval(delta.ci95, true))),
      h("div", { className: "facts" },
        `paired by scenario: ${fmtP(delta.p_value)} · ${fmtInt(delta.n_paired)} paired scenarios · `,
        `${nLine(delta.before)} · ${noisePhrase(delta)}`),
      flagList(delta));
  } else if (status === "running") {
    parts.push(box("training", "training", "verdict when the holdout is evaluated again"));
    numbers.push(
      summary.before ? h("div", { className: "big-line" }, passLine("before", summary.before)) : null,
      h("div", { className: "facts" },
        "The before/after comparison, its interval and verdict appear here when training ",
        "ends and the holdout is evaluated again."));
  } else {
    const word = status === "failed" ? "failed" : status === "stopped" ? "stopped" : "no verdict";
    const family = status === "failed" ? "down" : "none";
    parts.push(box(family, word, summary.stop_reason ? `stopped by ${summary.stop_reason}` :
      "no after-evaluation"));
    numbers.push(
      summary.before ? h("div", { className: "big-line" }, passLine("before", summary.before)) : null,
      h("div", { className: "facts" },
        summary.before ? nLine(summary.before) : "", summary.before ? " · " : "",
        "the run ended before the trained policy was evaluated"));
  }
  if (summary.error) numbers.push(h("div", { className: "error-box" }, summary.error));
  if (compareRun) numbers.push(compareLine(compareRun));
  parts.push(h("div", { className: "headline-numbers" }, numbers));
  return parts;
}

function flagList(delta) {
  const items = [];
  for (const guard of delta.guards || []) {
    const state = guard.fell ? "FELL" : guard.degenerate ? "constant on both sides" : "held";
    items.push(h("li", { className: guard.fell ? "bad" : "" },
      `guard ${guard.name}: ${fmtRate(guard.before)} → ${fmtRate(guard.after)}, `,
      `${fmtSigned(guard.delta)} ${fmtInterval(guard.ci95, true)}, ${state}`));
  }
  for (const group of delta.groups || []) {
    if (!group.down) continue;
    items.push(h("li", { className: "bad" },
      `DOWN: ${group.name} ${fmtRate(group.before)} → ${fmtRate(group.after)}, `,
      `${fmtSigned(group.delta)} ${fmtInterval(group.ci95, true)}`));
  }
  const downNames = (delta.groups || []).filter((g) => g.down).map((g) => g.name);
  for (const warning of delta.warnings || []) {
    // the report also words each DOWN group as a warning; it is listed above already
    if (downNames.some((name) => warning.includes(` ${name} went DOWN`))) continue;
    items.push(h("li", { className: "warn" }, warning));
  }
  return items.length ? h("ul", { className: "flag-list", id: "flags" }, items) : null;
}

function compareLine(compareRun) {
  const delta = (compareRun.summary || {}).delta;
  const text = delta && delta.verdict
    ? [`${fmtRate((delta.before || {}).pass_at_1)} → ${fmtRate((delta.after || {}).pass_at_1)}, `,
      `delta ${fmtSigned(delta.delta)} ${fmtInterval(delta.ci95, true)} `, verdictPill(delta.verdict)]
    : [`status ${compareRun.status}, no verdict yet`];
  return h("div", { className: "compare-line" }, `compared with ${compareRun.name}: `, ...text);
}

// --- forest plot: pass@1 before and after, overall and by category ----------------------------

/** SVG: one row per group, the before interval (grey) above the after interval (colour). */
export function forestPlot(summary) {
  const delta = summary.delta || {};
  const before = new Map((summary.by_category_before || []).map((g) => [g.name, g]));
  const after = new Map((summary.by_category_after || []).map((g) => [g.name, g]));
  const groups = new Map((delta.groups || []).map((g) => [g.name, g]));
  const rows = [{ name: "overall", before: summary.before, after: summary.after, down: false,
    family: verdictFamily(delta.verdict) }];
  for (const [name, group] of before) {
    const change = groups.get(name);
    rows.push({ name, before: group, after: after.get(name), down: change ? change.down : false,
      family: change ? verdictFamily(change.verdict) : "none" });
  }
  const left = 96;
  const width = 520;
  const right = 16;
  const rowHeight = 38;
  const top = 8;
  const height = top + rows.length * rowHeight + 28;
  const x = (value) => left + value * (width - left - right);
  const plot = svg("svg", { class: "forest", viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "pass@1 before and after with 95% intervals" });
  const axis = svg("g", { class: "axis" });
  for (const tick of [0, 0.25, 0.5, 0.75, 1]) {
    axis.append(
      svg("line", { class: "grid", x1: x(tick), x2: x(tick), y1: top, y2: height - 22 }),
      svg("text", { x: x(tick), y: height - 8, "text-anchor": "middle" }, tick.toFixed(2)));
  }
  plot.append(axis);
  const colours = { moved: "#15803d", down: "#b91c1c", flat: "#2563eb", none: "#2563eb" };
  rows.forEach((row, index) => {
    const y = top + index * rowHeight + 12;
    plot.append(svg("text", { x: 4, y: y + 6, "font-weight": index === 0 ? 700 : 400,
      fill: row.down ? "#b91c1c" : "#1c2430" }, row.name));
    const sides = [[row.before, "#94a3b8", 0], [row.after, colours[row.down ? "down" : row.family], 12]];
    for (const [result, colour, offset] of sides) {
      if (!result || !isNumber(result.pass_at_1)) continue;
      const cy = y + offset;
      if (Array.isArray(result.ci95)) {
        plot.append(svg("line", { x1: x(result.ci95[0]), x2: x(result.ci95[1]), y1: cy, y2: cy,
          stroke: colour, "stroke-width": 3, "stroke-linecap": "round" }));
      }
      plot.append(svg("circle", { cx: x(result.pass_at_1), cy, r: 5, fill: colour },
        svg("title", {}, `${fmtRate(result.pass_at_1)} ${fmtInterval(result.ci95)}`)));
    }
  });
  return h("div", {},
    plot,
    h("div", { className: "table-note" },
      "pass@1 with 95% interval: grey before, coloured after (green moved, red DOWN, blue flat)."));
}

// --- guards and noise -------------------------------------------------------------------------

export function statsTable(summary) {
  const delta = summary.delta || {};
  const noise = delta.noise || summary.noise;
  const rows = [];
  for (const guard of delta.guards || []) {
    rows.push([`guard ${guard.name}`,
      `${fmtRate(guard.before)} → ${fmtRate(guard.after)}, ${fmtSigned(guard.delta)} ` +
      `${fmtInterval(guard.ci95, true)} ${guard.fell ? "FELL" : guard.degenerate ? "(constant)" : "held"}`,
      guard.fell]);
  }
  rows.push(["paired scenarios", `${fmtInt(delta.n_paired)}` +
    (delta.n_unpaired_before || delta.n_unpaired_after
      ? ` (+${delta.n_unpaired_before} only before, ${delta.n_unpaired_after} only after)` : "")]);
  rows.push(["p-value (sign flip)", fmtP(delta.p_value).replace("p=", "")]);
  if (delta.ci95_t) rows.push(["paired t interval", fmtInterval(delta.ci95_t, true)]);
  if (noise) {
    rows.push(["noise band", isNumber(delta.noise_band_used) ? `±${fmtRate(delta.noise_band_used)}`
      : (noise.note || "none")]);
    if (Array.isArray(noise.pass_at_1)) {
      rows.push(["base re-evaluations (pass@1)", noise.pass_at_1.map(fmtRate).join(", ")]);
    }
  }
  if (isNumber(delta.detectable_effect)) {
    rows.push(["smallest gain detectable (80% power)", fmtRate(delta.detectable_effect)]);
  }
  return h("table", { className: "kv", id: "stats" },
    h("tbody", {}, rows.map(([key, value, bad]) =>
      h("tr", {}, h("td", {}, key), h("td", { className: bad ? "text-down" : "" }, value)))));
}

// --- category table -----------------------------------------------------------------------------

function deltaBar(group) {
  // the delta's interval on a -1..1 scale, 0 dashed, the noise band shaded
  const width = 140;
  const height = 18;
  const x = (value) => width / 2 + (value * width) / 2;
  const plot = svg("svg", { class: "forest", width, height, viewBox: `0 0 ${width} ${height}` });
  if (isNumber(group.noise_band)) {
    plot.append(svg("rect", { class: "band", x: x(-group.noise_band), y: 2,
      width: x(group.noise_band) - x(-group.noise_band), height: height - 4 }));
  }
  plot.append(svg("line", { class: "zero", x1: x(0), x2: x(0), y1: 0, y2: height }));
  const colour = group.down ? "#b91c1c" : verdictFamily(group.verdict) === "moved" ? "#15803d" : "#52606d";
  if (Array.isArray(group.ci95)) {
    plot.append(svg("line", { x1: x(group.ci95[0]), x2: x(group.ci95[1]), y1: height / 2,
      y2: height / 2, stroke: colour, "stroke-width": 3, "stroke-linecap": "round" }));
  }
  if (isNumber(group.delta)) plot.append(svg("circle", { cx: x(group.delta), cy: height / 2, r: 4, fill: colour }));
  return plot;
}

/** The table by category: before and after with intervals, the paired delta, DOWN marked. */
export function categoryTable(summary, compareSummary) {
  const before = new Map((summary.by_category_before || []).map((g) => [g.name, g]));
  const after = new Map((summary.by_category_after || []).map((g) => [g.name, g]));
  const groups = (summary.delta || {}).groups || [];
  const compareGroups = new Map((((compareSummary || {}).delta || {}).groups || []).map((g) => [g.name, g]));
  const names = groups.length ? groups.map((g) => g.name) : [...before.keys()];
  const byName = new Map(groups.map((g) => [g.name, g]));
  const head = ["category", "scenarios", "before [95%]", "after [95%]", "delta [95%]", "", "verdict",
    "tool calls"];
  if (compareGroups.size) head.push("delta, compared run");
  const rows = names.map((name) => {
    const group = byName.get(name) || {};
    const b = before.get(name);
    const a = after.get(name);
    const tool = isNumber(group.tool_call_before)
      ? `${fmtRate(group.tool_call_before)} → ${fmtRate(group.tool_call_after)}`
      : b && isNumber(b.tool_call_rate) ? fmtRate(b.tool_call_rate) : "–";
    const other = compareGroups.get(name);
    return h("tr", { className: group.down ? "down" : "", dataset: { group: name } },
      h("td", {}, h("b", {}, name)),
      h("td", { className: "num" }, fmtInt(group.n_paired ?? (b || {}).n_scenarios),
        group.low_n ? h("div", { className: "low-n", title: "too few paired scenarios for a significant change" }, "few scenarios") : null),
      h("td", { className: "num" }, b ? `${fmtRate(b.pass_at_1)} ${fmtInterval(b.ci95)}` : "–"),
      h("td", { className: "num" }, a ? `${fmtRate(a.pass_at_1)} ${fmtInterval(a.ci95)}` : "–"),
      h("td", { className: "num delta" }, isNumber(group.delta)
        ? `${fmtSigned(group.delta)} ${fmtInterval(group.ci95, true)}` : "–"),
      h("td", {}, isNumber(group.delta) ? deltaBar(group) : null),
      h("td", {}, verdictPill(group.verdict) || "–"),
      h("td", { className: "num" }, tool),
      compareGroups.size ? h("td", { className: "num cmp-value" }, other && isNumber(other.delta)
        ? `${fmtSigned(other.delta)} ${fmtInterval(other.ci95, true)} ${other.down ? "DOWN" : ""}` : "–") : null);
  });
  return h("div", {},
    h("table", { className: "cats", id: "categories" },
      h("thead", {}, h("tr", {}, head.map((text) => h("th", {}, text)))),
      h("tbody", {}, rows)),
    h("div", { className: "table-note" },
      "Each category's delta is paired by scenario within it; DOWN (interval below 0) is marked red ",
      "and is a warning, not a failure of the run. The shaded band on the bar is the noise band."));
}

// --- pair report ----------------------------------------------------------------------------

const PAIR_LABELS = {
  pairs: "pairs built from sampled replies",
  prompts_seen: "train prompts sampled",
  prompts_with_contrast: "prompts with contrast (a pass and a fail)",
  constructed_pairs: "constructed pairs (named mistake as rejected)",
  constructed_cap: "cap on constructed pairs",
  trl_rows: "rows given to the trainer",
  min_margin: "minimum score margin",
  mean_margin: "mean score margin",
  "length.median_delta": "median length difference, chosen − rejected (chars)",
  "length.chosen_longer": "pairs where chosen is longer",
  "length.chosen_longer_frac": "share of pairs where chosen is longer",
  first_turn_identical: "pairs dropped: identical first turns",
};

/** Nested objects as [["a.b", value], ...] in key order. */
export function flatten(value, prefix = "") {
  const out = [];
  for (const [key, item] of Object.entries(value || {})) {
    const path = prefix ? `${prefix}.${key}` : key;
    if (item && typeof item === "object" && !Array.isArray(item)) out.push(...flatten(item, path));
    else out.push([path, item]);
  }
  return out;
}

export function showValue(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") return Number.isInteger(value) ? fmtInt(value) : fmtValue(value);
  if (Array.isArray(value)) return value.length ? value.map(showValue).join(", ") : "none";
  return String(value);
}

/** What the run's training data could teach: GRPO's groups with a reward spread, DPO's
 * prompts with contrast, SFT's demonstrations. Null when the summary has none of them. */
export function signalReport(summary) {
  const rows = [];
  let advice = null;
  const signal = summary.signal;
  const pairs = summary.pair_report;
  const demos = summary.demo_report;
  if (signal && isNumber(signal.dead_group_share)) {
    rows.push(["groups with all-equal rewards (no advantage)",
      `${Math.round(signal.dead_group_share * 100)}% on average over ${signal.steps} steps`]);
    if (isNumber(signal.reward_spread)) {
      rows.push(["mean within-group reward spread", signal.reward_spread.toFixed(3)]);
    }
    if (signal.dead_group_share >= 0.5) {
      advice = "Most groups taught nothing: try a supervised cold start (posttrain sft, then " +
        "--from-run), more --num-generations, a higher --temperature or another prompt mix.";
    }
  } else if (pairs && isNumber(pairs.prompts_seen) && pairs.prompts_seen > 0) {
    const contrast = pairs.prompts_with_contrast || 0;
    rows.push(["prompts with contrast (a better and a worse reply)",
      `${contrast} of ${pairs.prompts_seen} (${Math.round(100 * contrast / pairs.prompts_seen)}%)`]);
  } else if (demos) {
    rows.push(["demonstrations kept", `${demos.kept} of ${demos.read} (${demos.prompts} distinct prompts)`]);
    rows.push(["dropped", `${demos.failed_rule} failing the rule, ${demos.duplicates} duplicates, ` +
      `${demos.holdout_leaks} on holdout prompts`]);
    rows.push(["source", demos.source]);
  }
  if (!rows.length) return null;
  return h("div", {},
    h("table", { className: "kv", id: "signal" }, h("tbody", {}, rows.map(([key, value]) =>
      h("tr", {}, h("td", {}, key), h("td", {}, value))))),
    advice ? h("p", { className: "text-down", id: "signal-advice" }, advice) : null);
}

export function pairReport(report) {
  const warnings = Array.isArray(report.warnings) ? report.warnings : [];
  const rows = flatten(report).filter(([key]) => key !== "warnings");
  return h("div", {},
    h("table", { className: "kv", id: "pair-report" }, h("tbody", {}, rows.map(([key, value]) =>
      h("tr", {}, h("td", { title: key }, PAIR_LABELS[key] || key), h("td", {}, showValue(value)))))),
    warnings.length ? h("ul", { className: "warnings" }, warnings.map((w) => h("li", {}, w))) : null);
}

// --- config, timings -------------------------------------------------------------------------

// the few settings a reader needs first, in this order: [label, config path(s)]
const KEY_SETTINGS = [
  ["recipe", ["recipe"]],
  ["environment", ["settings.env"]],
  ["base model", ["settings.base_model", "base_model"]],
  ["started from run", ["resolved.from_run"]],
  ["learning rate", ["resolved.learning_rate"]],
  ["steps", ["settings.steps"]],
  ["batch size", ["settings.batch_size"]],
  ["completions per prompt", ["settings.num_generations"]],
  ["loss", ["settings.loss_type"]],
  ["beta", ["settings.beta"]],
  ["demonstrations", ["settings.demos"]],
  ["training seed", ["settings.seed"]],
  ["data seed", ["settings.data_seed"]],
  ["evaluation seed", ["settings.eval_seed"]],
  ["data", ["data.source"]],
];

/** The settings that define the run, first; null values are left out. */
export function keySettings(config, compareConfig) {
  const mine = new Map(flatten(config));
  const theirs = compareConfig ? new Map(flatten(compareConfig)) : null;
  const rows = [];
  for (const [label, paths] of KEY_SETTINGS) {
    const path = paths.find((p) => mine.has(p) && mine.get(p) !== null);
    if (!path) continue;
    const value = showValue(mine.get(path));
    const other = theirs ? showValue(theirs.get(path)) : null;
    rows.push(h("tr", { className: theirs && other !== value ? "diff-changed" : "", dataset: { key: path } },
      h("td", {}, label), h("td", { className: "mono" }, value),
      theirs ? h("td", { className: "mono cmp-value" }, other) : null));
  }
  return h("table", { className: "kv", id: "key-settings-table" }, h("tbody", {}, rows));
}

/** The config as a flat table; with a compared run, its values beside and differences marked. */
export function configTable(config, compareConfig) {
  const mine = new Map(flatten(config));
  const theirs = compareConfig ? new Map(flatten(compareConfig)) : null;
  const keys = [...mine.keys()];
  if (theirs) for (const key of theirs.keys()) if (!mine.has(key)) keys.push(key);
  let differing = 0;
  const rows = keys.map((key) => {
    const value = showValue(mine.get(key));
    const other = theirs ? showValue(theirs.get(key)) : null;
    const changed = theirs && other !== value;
    if (changed) differing += 1;
    return h("tr", { className: changed ? "diff-changed" : "" },
      h("td", { className: "mono" }, key), h("td", { className: "mono" }, value),
      theirs ? h("td", { className: "mono cmp-value" }, other) : null);
  });
  const head = theirs ? h("thead", {}, h("tr", {}, h("th", {}, "setting"), h("th", {}, "this run"),
    h("th", {}, "compared run"))) : null;
  return {
    differing,
    count: keys.length,
    element: h("table", { className: "kv", id: "config" }, head, h("tbody", {}, rows)),
  };
}

export function timingsTable(summary) {
  const rows = [];
  const labels = { data_s: "data", load_s: "load model", before_eval_s: "evaluate before",
    train_s: "train", after_eval_s: "evaluate after", total_s: "total" };
  for (const [key, value] of Object.entries(summary.timings || {})) {
    rows.push([labels[key] || key, fmtDuration(value)]);
  }
  const trainer = summary.trainer || {};
  if (isNumber(trainer.train_steps_per_second)) {
    rows.push(["seconds per step", fmtValue(1 / trainer.train_steps_per_second)]);
  }
  if (!rows.length) return null;
  return h("table", { className: "kv", id: "timings" },
    h("tbody", {}, rows.map(([key, value]) => h("tr", {}, h("td", {}, key), h("td", {}, value)))));
}
