// "What the policy said": graded holdout rows of a run, before or after training.
//
// A single-reply row is the customer's message and the policy's reply; a multi-turn row
// (one with a transcript) is the whole episode as a conversation: the policy's turns,
// its tool calls and the tool results that came back. Text goes in through textContent
// only (h() in common.js), so nothing a policy wrote can become markup.

import { fill, getJSON, h } from "./common.js";

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

function sampleCard(row) {
  const passed = row.reward === 1;
  const episode = row.episode
    ? ` · ${row.episode.turns} turns, ${row.episode.tool_calls} tool calls, ended by ${row.episode.ended}`
    : "";
  return h("article", { className: "sample", dataset: { category: row.category || "" } },
    h("div", { className: "sample-head" },
      h("span", { className: `pill ${passed ? "verdict-moved" : "verdict-down"}` },
        passed ? "pass" : "fail"),
      h("span", { className: "num" }, ` score ${Number(row.score).toFixed(2)}`),
      h("span", { className: "muted" }, ` · ${row.category || "all"}${episode}`)),
    h("div", { className: "conversation" }, conversation(row)));
}

/** Fill ``box`` with run ``name``'s rows (``which``: "before" or "after"). */
export async function showSamples(box, name, which) {
  const { status, data } = await getJSON(
    `/api/runs/${encodeURIComponent(name)}/samples?which=${which}&limit=40`);
  if (status !== 200) {
    fill(box, h("p", { className: "muted" }, `could not read the samples (${status})`));
    return false;
  }
  if (!data.available || !data.rows.length) {
    fill(box, h("p", { className: "muted" },
      `no ${which}-training samples in this run's folder (yet)`));
    return false;
  }
  fill(box, data.rows.map(sampleCard));
  return true;
}
