// "What the policy said": graded holdout rows of a run, before or after training.
//
// A single-reply row is the customer's message and the policy's reply; a multi-turn row
// (one with a transcript) is the whole episode as a conversation: the policy's turns,
// its tool calls and the tool results that came back. Text goes in through textContent
// only (h() in common.js), so nothing a policy wrote can become markup.

import { fill, getJSON, h, errorText } from "./common.js";

const TOOL_CALL = /<tool_call>\s*([\s\S]*?)\s*<\/tool_call>/g;

function turnText(text) {
  // a tool call reads as "name(arguments)"; the rest of the turn stays as written
  const parts = [];
  let last = 0;
  for (const match of (text || "").matchAll(TOOL_CALL)) {
    const before = text.slice(last, match.index).trim();
    if (before) parts.push(h("span", {}, before));
    let call = match[1];
    try {
      const parsed = JSON.parse(match[1]);
      call = `${parsed.name}(${JSON.stringify(parsed.arguments || {})})`;
    } catch (_) { /* a broken block is shown as written */ }
    parts.push(h("code", { className: "tool-call" }, call));
    last = match.index + match[0].length;
  }
  const rest = (text || "").slice(last).trim();
  if (rest) parts.push(h("span", {}, rest));
  if (!parts.length) parts.push(h("span", { className: "muted" }, "(empty)"));
  return parts;
}

function bubble(role, label, ...content) {
  return h("div", { className: `bubble ${role}`, dataset: { role } },
    h("div", { className: "bubble-label" }, label), h("div", { className: "bubble-text" }, content));
}

function conversation(row) {
  const items = [bubble("user", "customer", row.prompt)];
  const transcript = Array.isArray(row.transcript) ? row.transcript : null;
  if (transcript) {
    for (const message of transcript) {
      if (message.role === "tool") {
        items.push(bubble("tool", `tool result · ${message.name || "tool"}`,
          h("code", {}, message.content)));
      } else {
        items.push(bubble("assistant", "policy", turnText(message.content)));
      }
    }
  } else {
    items.push(bubble("assistant", "policy", turnText(row.reply)));
  }
  return items;
}

function passPill(row) {
  const passed = row.reward === 1;
  return h("span", { className: `pill ${passed ? "verdict-moved" : "verdict-down"}` },
    passed ? "pass" : "fail");
}

function markerText(row) {
  const markers = row.markers && typeof row.markers === "object" ? row.markers : {};
  const on = Object.entries(markers).filter(([, value]) => Number(value) > 0).map(([key]) => key);
  return on.length ? ` · ${on.join(", ")}` : "";
}

function sampleCard(row) {
  const episode = row.episode
    ? ` · ${row.episode.turns} turns, ${row.episode.tool_calls} tool calls, ended by ${row.episode.ended}`
    : "";
  return h("article", { className: "sample", dataset: { category: row.category || "",
    outcome: row.reward === 1 ? "pass" : "fail" } },
    h("div", { className: "sample-head" }, passPill(row),
      h("span", { className: "num" }, ` score ${Number(row.score).toFixed(2)}`),
      h("span", { className: "muted" }, ` · ${row.category || "all"}${episode}${markerText(row)}`)),
    h("div", { className: "conversation" }, conversation(row)));
}

/** The rows that pass the filters: category ("" = all), outcome ("", "pass", "fail") and
 * a text that must appear in the prompt or the reply (case-insensitive). */
export function filterRows(rows, { category = "", outcome = "", text = "" } = {}) {
  const needle = text.trim().toLowerCase();
  return rows.filter((row) => (!category || row.category === category)
    && (!outcome || (outcome === "pass") === (row.reward === 1))
    && (!needle || `${row.prompt || ""}\n${row.reply || ""}`.toLowerCase().includes(needle)));
}

/** Before and after rows of the same prompt and sample, side by side. */
export function pairRows(before, after) {
  const key = (row) => `${row.sample}\u0000${row.prompt}`;
  const earlier = new Map(before.map((row) => [key(row), row]));
  return after.filter((row) => earlier.has(key(row))).map((row) => ({ before: earlier.get(key(row)), after: row }));
}

function sideBySide(pairs) {
  return h("table", { className: "data side-by-side", id: "side-by-side" },
    h("thead", {}, h("tr", {}, h("th", {}, "prompt"), h("th", {}, "before"), h("th", {}, "after"))),
    h("tbody", {}, pairs.map(({ before, after }) => h("tr", {
      dataset: { category: after.category || "", change: `${before.reward}->${after.reward}` } },
    h("td", {}, h("div", { className: "muted" }, after.category || ""), after.prompt),
    h("td", {}, passPill(before), " ", turnText(before.reply)),
    h("td", {}, passPill(after), " ", turnText(after.reply))))));
}

async function fetchRows(name, which, limit = 200) {
  const [source, step] = which.split(":");
  const query = step !== undefined ? `which=${source}&step=${step}` : `which=${source}&limit=${limit}`;
  const { status, data } = await getJSON(`/api/runs/${encodeURIComponent(name)}/samples?${query}`);
  if (status !== 200) throw new Error(errorText(data, status));
  return data.available ? data.rows : null;
}

/**
 * Fill ``box`` with run ``name``'s rows. ``which``: "after", "before", "compare" (before
 * and after side by side), "monitor:<step>" (the holdout replies the hack monitor graded
 * at that check) or "rollouts:<step>" (training replies up to that check). ``filters``:
 * see filterRows. ``isCurrent()``: false once a newer request was made, so an answer that
 * arrives late never replaces a newer one. Returns the categories found, or null.
 */
export async function showSamples(box, name, which, filters = {}, isCurrent = () => true) {
  let rows;
  let pairs = null;
  try {
    if (which === "compare") {
      const [before, after] = await Promise.all([fetchRows(name, "before"), fetchRows(name, "after")]);
      if (before && after) pairs = pairRows(before, after);
      rows = pairs ? pairs.map((pair) => pair.after) : null;
    } else {
      rows = await fetchRows(name, which);
    }
  } catch (error) {
    if (isCurrent()) fill(box, h("p", { className: "muted" }, `could not read the samples (${error.message})`));
    return null;
  }
  if (!isCurrent()) return null;
  if (!rows || !rows.length) {
    const what = which === "before" || which === "after"
      ? `no ${which}-training samples in this run's folder (yet)`
      : which === "compare" ? "no before and after samples to pair in this run's folder (yet)"
        : "no replies were kept for this check";
    fill(box, h("p", { className: "muted" }, what));
    return null;
  }
  const categories = [...new Set(rows.map((row) => row.category).filter(Boolean))].sort();
  if (pairs) {
    const kept = new Set(filterRows(rows, filters));
    const shown = pairs.filter((pair) => kept.has(pair.after));
    fill(box, h("p", { className: "muted", id: "samples-count" }, `${shown.length} of ${pairs.length} prompts`),
      sideBySide(shown));
  } else {
    const shown = filterRows(rows, filters);
    fill(box, h("p", { className: "muted", id: "samples-count" }, `${shown.length} of ${rows.length} replies`),
      shown.map(sampleCard));
  }
  return categories;
}
