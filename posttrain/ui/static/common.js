// Helpers shared by the run list and the run page: DOM building, the JSON API, formatting.
//
// Every piece of run data (names, config values, alarm messages) reaches the page through
// textContent, never innerHTML, so text from a run can never become markup.

/** Build an element: h("td", {className: "num", title: "..."}, "text", childNode, ...). */
export function h(tag, props = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "className") element.className = value;
    else if (key === "dataset") Object.assign(element.dataset, value);
    else if (key === "style") Object.assign(element.style, value);
    else if (key.startsWith("on")) element.addEventListener(key.slice(2), value);
    else if (key in element && typeof value !== "string") element[key] = value;
    else element.setAttribute(key, value === true ? "" : value);
  }
  appendChildren(element, children);
  return element;
}

function appendChildren(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** An SVG element with attributes. */
export function svg(tag, attrs = {}, ...children) {
  const element = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) element.setAttribute(key, value);
  }
  appendChildren(element, children);
  return element;
}

/** Replace an element's children. */
export function fill(element, ...children) {
  element.replaceChildren();
  appendChildren(element, children);
  return element;
}

/** Seconds the server's clock is ahead of this browser's, from the last answer's Date header. */
export const clock = { offset: 0 };

/** Server "now" in epoch seconds (run times come from the server's clock). */
export function serverNow() {
  return Date.now() / 1000 + clock.offset;
}

/** POST a JSON body; resolves to {status, data} like getJSON. */
export async function postJSON(url, body) {
  const response = await fetch(url, {
    method: "POST", cache: "no-store",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  let data = null;
  try {
    data = await response.json();
  } catch (error) {
    data = { error: `not JSON (HTTP ${response.status})` };
  }
  return { status: response.status, data };
}

/** GET a JSON document; resolves to {status, data}. Network failures reject. */
export async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  const date = response.headers.get("Date");
  if (date) {
    const server = Date.parse(date) / 1000;
    // the header has 1 s resolution: ignore offsets inside that
    const offset = server - Date.now() / 1000;
    clock.offset = Math.abs(offset) > 2 ? offset : 0;
  }
  let data = null;
  try {
    data = await response.json();
  } catch (error) {
    data = { error: `not JSON (HTTP ${response.status})` };
  }
  return { status: response.status, data };
}

// --- formatting ---------------------------------------------------------------------------

// the servers' one error envelope: {"error": {"status", "message"}}
export function errorText(data, status) {
  const error = data && data.error;
  if (error && typeof error === "object" && error.message) return error.message;
  return error ? String(error) : `HTTP ${status}`;
}

export function isNumber(value) {
  return typeof value === "number" && Number.isFinite(value);
}

/** A rate like pass@1: 0.2938 -> "0.29"; null -> "n/a". */
export function fmtRate(value) {
  return isNumber(value) ? value.toFixed(2) : "n/a";
}

/** A signed difference: 0.16 -> "+0.16", -0.15 -> "−0.15". */
export function fmtSigned(value) {
  if (!isNumber(value)) return "n/a";
  const text = Math.abs(value).toFixed(2);
  if (text === "0.00") return "0.00";
  return (value > 0 ? "+" : "−") + text;
}

/** An interval: [0.22, 0.35]; signed: [+0.09, +0.23]; missing: [n/a]. */
export function fmtInterval(interval, signed = false) {
  if (!Array.isArray(interval) || interval.length !== 2) return "[n/a]";
  const show = signed ? fmtSigned : fmtRate;
  return `[${show(interval[0])}, ${show(interval[1])}]`;
}

/** A p-value: p=0.012, p<0.001. */
export function fmtP(value) {
  if (!isNumber(value)) return "p=n/a";
  return value < 0.001 ? "p<0.001" : `p=${value.toFixed(3)}`;
}

/** A metric value for a chart or a table: about 4 significant digits, no trailing zeros. */
export function fmtValue(value) {
  if (!isNumber(value)) return "–";
  const size = Math.abs(value);
  if (size === 0) return "0";
  if (size >= 1e6 || size < 1e-3) return value.toExponential(2);
  if (size >= 1000) return Math.round(value).toLocaleString("en-US");
  return String(Number(value.toPrecision(4)));
}

/** An integer with thousands separators. */
export function fmtInt(value) {
  return isNumber(value) ? Math.round(value).toLocaleString("en-US") : "–";
}

/** Seconds as "45 s", "3 min 20 s", "2 h 05 min". */
export function fmtDuration(seconds) {
  if (!isNumber(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  const minutes = Math.floor(s / 60);
  if (minutes < 48 * 60) {
    return `${Math.floor(minutes / 60)} h ${String(minutes % 60).padStart(2, "0")} min`;
  }
  return `${Math.floor(minutes / 1440)} days ${Math.floor((minutes % 1440) / 60)} h`;
}

/** How long ago an epoch time was: "12 s ago", "3 min ago". */
export function fmtAgo(epochSeconds) {
  if (!isNumber(epochSeconds)) return "–";
  return `${fmtDuration(serverNow() - epochSeconds)} ago`;
}

/** An epoch time as local "2026-05-01 14:03". */
export function fmtDate(epochSeconds) {
  if (!isNumber(epochSeconds)) return "–";
  const date = new Date(epochSeconds * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
    `${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

// --- run status and verdict words -----------------------------------------------------------

/** {label, cls, title} for a run's status. "lost" comes from the server: the run is still
 * marked running but its process stopped sending heartbeats (killed, crashed). */
export function statusInfo(run) {
  const status = run.status || "running";
  if (status === "lost") {
    const silent = isNumber(run.updated) ? ` for ${fmtDuration(serverNow() - run.updated)}` : "";
    return {
      label: "lost", cls: "status-lost",
      title: `never finished, and no heartbeat${silent}: the training process was killed ` +
        "or crashed before it could write a final state",
    };
  }
  return { label: status, cls: `status-${status}`, title: "" };
}

export function statusPill(run) {
  const info = statusInfo(run);
  return h("span", { className: `pill ${info.cls}`, title: info.title || null }, info.label);
}

/** The CSS family of a verdict word: moved, down, flat, or none (no verdict possible). */
export function verdictFamily(verdict) {
  if (!verdict) return "none";
  if (verdict === "moved") return "moved";
  if (verdict === "DOWN") return "down";
  if (verdict.startsWith("flat")) return "flat";
  return "none";
}

export function verdictPill(verdict) {
  if (!verdict) return null;
  return h("span", { className: `pill verdict-${verdictFamily(verdict)}` }, verdict);
}
