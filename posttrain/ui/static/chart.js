// Line charts on <canvas>, written for this dashboard: no library, nothing from a CDN.
//
// A ChartGroup holds the settings every chart shares (smoothing weight, zoomed step
// range, hovered step), so hovering one chart moves the crosshair on all of them and a
// zoom applies to all. Each LineChart draws its series (this run, and optionally a
// compared run), with the run's alarms as dashed red lines at their steps. Drag across a
// chart to zoom; double-click to reset.
//
// How a series is drawn depends on how many of its points are in view (traceOf):
// - up to one point per pixel column: a faint raw line under the smoothed line (the raw
//   line alone when smoothing is off, or when the series has under 20 points, where an
//   EMA would only lag: the monitor logs every 10 steps);
// - more: a faint band from each pixel column's lowest to highest point, so every spike
//   stays visible, and a line through the band's middle, smoothed when smoothing is on.
//   A long curve arrives from the server as each bucket's min and max
//   (posttrain/runs/downsample.py), which a plain line would draw as a solid zigzag.
//
// Smoothing is TensorBoard's debiased exponential moving average (curve_math.js).

import { fmtInt, fmtValue, h, isNumber } from "./common.js";
import { nearestIndex, niceTicks, smoothEMA } from "./curve_math.js";

const PAD = { left: 58, right: 14, top: 10, bottom: 24 };
const DOTS_BELOW = 80; // series with fewer points also get a dot per point
const MIN_POINTS_TO_SMOOTH = 20; // a shorter series is drawn raw: an EMA of 4 points only lags

function fmtStep(value) {
  if (Math.abs(value) >= 10000) return `${Number((value / 1000).toPrecision(3))}k`;
  return fmtInt(value);
}

/** Settings shared by a page's charts: smoothing, zoomed step range, hovered step. */
export class ChartGroup {
  constructor() {
    this.charts = [];
    this.smoothing = 0.6;
    this.xRange = null; // [low, high] steps, or null for everything
    this.hoverStep = null;
    this.hoverSource = null; // the chart under the mouse: it alone shows the tooltip
    this.markers = []; // [{step, label}]
    // how the tooltip names an x position (the page switches it for a wall-clock axis)
    this.formatX = (x) => `step ${fmtInt(x)}`;
  }

  add(chart) {
    this.charts.push(chart);
    return chart;
  }

  remove(chart) {
    this.charts = this.charts.filter((c) => c !== chart);
  }

  setSmoothing(weight) {
    this.smoothing = weight;
    this.drawAll();
  }

  setXRange(range) {
    this.xRange = range;
    this.drawAll();
  }

  setMarkers(markers) {
    this.markers = markers;
    this.drawAll();
  }

  setHover(step, source) {
    this.hoverStep = step;
    this.hoverSource = step === null ? null : source;
    for (const chart of this.charts) chart.drawOverlay(chart === this.hoverSource);
  }

  /** Steps from the first to the last point of any chart: every chart spans the same
   * steps, so the crosshair and the alarm lines line up from chart to chart. */
  extent() {
    let low = Infinity;
    let high = -Infinity;
    for (const chart of this.charts) {
      for (const s of chart.series) {
        if (!s.steps.length) continue;
        low = Math.min(low, s.steps[0]);
        high = Math.max(high, s.steps[s.steps.length - 1]);
      }
    }
    return Number.isFinite(low) ? [low, high] : null;
  }

  drawAll() {
    for (const chart of this.charts) chart.draw();
  }
}

/**
 * One metric's chart. `series` entries: {id, label, color, steps, values, dashed}.
 * The element (chart.element) holds a header (title, value at the hovered or last
 * step), a help line and two canvases (lines, and the crosshair overlay).
 */
export class LineChart {
  constructor(group, { metric, title, help = "", dataUrl = null, csvUrl = null }) {
    this.group = group;
    this.metric = metric;
    this.series = [];
    this.pixelRatio = window.devicePixelRatio || 1;
    this.valueLabel = h("span", { className: "chart-latest num" });
    this.base = h("canvas", { className: "base" });
    this.overlay = h("canvas", { className: "overlay" });
    this.tooltip = h("div", { className: "tooltip", hidden: true });
    this.emptyLabel = h("div", { className: "chart-empty" }, "no points yet");
    this.canvasBox = h("div", { className: "chart-canvas" },
      this.base, this.overlay, this.emptyLabel, this.tooltip);
    this.element = h("div", { className: "chart", dataset: { metric, lastStep: "-1", points: "0" } },
      h("div", { className: "chart-head" },
        h("span", {},
          h("span", { className: "chart-title", title: metric }, title || metric),
          dataUrl ? h("a", { className: "chart-data", href: dataUrl, target: "_blank",
            title: "every point of this run's curve, as JSON" }, "json") : null,
          csvUrl ? h("a", { className: "chart-data", href: csvUrl, download: "",
            title: "every point of this run's curve, as CSV" }, "csv") : null),
        this.valueLabel),
      h("div", { className: "chart-help" }, help),
      this.canvasBox);
    this.drag = null;
    this.layout = null;
    this.bindEvents();
    this.resizer = new ResizeObserver(() => this.draw());
    this.resizer.observe(this.canvasBox);
  }

  destroy() {
    this.resizer.disconnect();
    this.group.remove(this);
    this.element.remove();
  }

  /** Replace the series; draws unless `draw` is false (then call group.drawAll()). */
  setSeries(series, draw = true) {
    this.series = series;
    const main = series.find((s) => s.id === "main");
    const steps = main ? main.steps : [];
    this.element.dataset.lastStep = String(steps.length ? steps[steps.length - 1] : -1);
    this.element.dataset.points = String(steps.length);
    if (draw) this.draw();
  }

  // --- geometry -----------------------------------------------------------------------

  computeLayout(width, height) {
    if (!this.series.some((s) => s.steps.length)) return null;
    let [xLow, xHigh] = this.group.xRange || this.group.extent();
    if (xHigh <= xLow) { xLow -= 1; xHigh += 1; }
    let yLow = Infinity;
    let yHigh = -Infinity;
    for (const s of this.series) {
      for (let i = 0; i < s.steps.length; i++) {
        if (s.steps[i] < xLow || s.steps[i] > xHigh) continue;
        const value = s.values[i];
        if (!Number.isFinite(value)) continue;
        if (value < yLow) yLow = value;
        if (value > yHigh) yHigh = value;
      }
    }
    if (!Number.isFinite(yLow)) { yLow = 0; yHigh = 1; }
    const pad = yHigh - yLow < 1e-12 ? Math.abs(yHigh) * 0.05 || 0.5 : (yHigh - yLow) * 0.06;
    yLow -= pad;
    yHigh += pad;
    const plotWidth = Math.max(10, width - PAD.left - PAD.right);
    const plotHeight = Math.max(10, height - PAD.top - PAD.bottom);
    return {
      width, height, xLow, xHigh, yLow, yHigh, plotWidth, plotHeight,
      x: (step) => PAD.left + ((step - xLow) / (xHigh - xLow)) * plotWidth,
      y: (value) => PAD.top + (1 - (value - yLow) / (yHigh - yLow)) * plotHeight,
      stepAt: (px) => xLow + ((px - PAD.left) / plotWidth) * (xHigh - xLow),
    };
  }

  /**
   * What to draw for one series at this size. A series with more points in view than the
   * plot has pixel columns is drawn "dense": a faint band from each column's lowest to its
   * highest point, and a line through the middle of the band (smoothed when smoothing is
   * on). Otherwise the points are drawn as they are: a faint raw line under the smoothed
   * one, or the raw line alone when smoothing is off or the series is short.
   */
  traceOf(series, layout) {
    const weight = this.group.smoothing;
    const { steps, values } = series;
    let first = 0;
    let last = steps.length - 1;
    while (first < last && steps[first + 1] < layout.xLow) first += 1;
    while (last > first && steps[last - 1] > layout.xHigh) last -= 1;
    const inView = last - first + 1;
    if (inView > layout.plotWidth) {
      const columns = Math.ceil(layout.plotWidth);
      const low = new Array(columns).fill(Infinity);
      const high = new Array(columns).fill(-Infinity);
      for (let i = first; i <= last; i++) {
        const value = values[i];
        if (!Number.isFinite(value)) continue;
        const column = Math.min(columns - 1, Math.max(0, Math.floor(layout.x(steps[i]) - PAD.left)));
        if (value < low[column]) low[column] = value;
        if (value > high[column]) high[column] = value;
      }
      const trace = { dense: true, steps: [], low: [], high: [], line: [], smoothed: weight > 0 };
      const middle = [];
      for (let column = 0; column < columns; column++) {
        if (low[column] === Infinity) continue;
        trace.steps.push(layout.stepAt(PAD.left + column + 0.5));
        trace.low.push(low[column]);
        trace.high.push(high[column]);
        middle.push((low[column] + high[column]) / 2);
      }
      trace.line = smoothEMA(middle, weight);
      return trace;
    }
    const smoothed = weight > 0 && steps.length >= MIN_POINTS_TO_SMOOTH;
    return {
      dense: false, steps, raw: smoothed ? values : null, smoothed,
      line: smoothed ? smoothEMA(values, weight) : values,
    };
  }

  sizeCanvas(canvas) {
    const width = this.canvasBox.clientWidth;
    const height = this.canvasBox.clientHeight;
    const ratio = this.pixelRatio;
    if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
    }
    const context = canvas.getContext("2d");
    context.setTransform(ratio, 0, 0, ratio, 0, 0);
    context.clearRect(0, 0, width, height);
    return { context, width, height };
  }

  // --- drawing ------------------------------------------------------------------------

  draw() {
    const { context, width, height } = this.sizeCanvas(this.base);
    const layout = width >= 20 ? this.computeLayout(width, height) : null;
    this.layout = layout;
    this.emptyLabel.hidden = this.series.some((s) => s.steps.length);
    for (const s of this.series) s.trace = layout && s.steps.length ? this.traceOf(s, layout) : null;
    this.drawOverlay(this.group.hoverSource === this);
    if (!layout) return;
    this.drawAxes(context, layout);
    this.drawMarkers(context, layout);
    context.save();
    context.beginPath();
    context.rect(PAD.left, PAD.top - 2, layout.plotWidth, layout.plotHeight + 4);
    context.clip();
    for (const s of this.series) {
      const trace = s.trace;
      if (!trace) continue;
      const dash = s.dashed ? [5, 4] : [];
      if (trace.dense) {
        this.drawBand(context, layout, trace, s.color);
        this.drawLine(context, layout, trace.steps, trace.line, s.color, 1.8, 1, dash);
        continue;
      }
      if (trace.raw) this.drawLine(context, layout, trace.steps, trace.raw, s.color, 1, 0.3, dash);
      this.drawLine(context, layout, trace.steps, trace.line, s.color, trace.raw ? 2.2 : 1.6, 1, dash);
      // dots mark the points of a short raw curve (the monitor's); on a smoothed one they are noise
      if (!trace.raw && s.steps.length < DOTS_BELOW) this.drawDots(context, layout, trace.steps, trace.line, s.color);
    }
    context.restore();
  }

  drawBand(context, layout, trace, color) {
    context.fillStyle = color;
    context.globalAlpha = 0.2;
    context.beginPath();
    for (let i = 0; i < trace.steps.length; i++) {
      const px = layout.x(trace.steps[i]);
      if (i === 0) context.moveTo(px, layout.y(trace.high[i]));
      else context.lineTo(px, layout.y(trace.high[i]));
    }
    for (let i = trace.steps.length - 1; i >= 0; i--) {
      context.lineTo(layout.x(trace.steps[i]), layout.y(trace.low[i]));
    }
    context.closePath();
    context.fill();
    context.globalAlpha = 1;
  }

  drawLine(context, layout, steps, values, color, lineWidth, alpha, dash) {
    context.strokeStyle = color;
    context.globalAlpha = alpha;
    context.lineWidth = lineWidth;
    context.lineJoin = "round";
    context.setLineDash(dash);
    context.beginPath();
    let drawing = false;
    for (let i = 0; i < steps.length; i++) {
      const value = values[i];
      if (!Number.isFinite(value)) { drawing = false; continue; }
      const px = layout.x(steps[i]);
      const py = layout.y(value);
      if (drawing) context.lineTo(px, py);
      else { context.moveTo(px, py); drawing = true; }
    }
    context.stroke();
    context.setLineDash([]);
    context.globalAlpha = 1;
  }

  drawDots(context, layout, steps, values, color) {
    context.fillStyle = color;
    for (let i = 0; i < steps.length; i++) {
      if (!Number.isFinite(values[i])) continue;
      context.beginPath();
      context.arc(layout.x(steps[i]), layout.y(values[i]), 2.6, 0, 2 * Math.PI);
      context.fill();
    }
  }

  drawAxes(context, layout) {
    context.font = "11px system-ui, sans-serif";
    context.fillStyle = "#8a94a3";
    context.strokeStyle = "#edf0f3";
    context.lineWidth = 1;
    context.textAlign = "right";
    context.textBaseline = "middle";
    for (const tick of niceTicks(layout.yLow, layout.yHigh, 4)) {
      const py = Math.round(layout.y(tick)) + 0.5;
      context.beginPath();
      context.moveTo(PAD.left, py);
      context.lineTo(layout.width - PAD.right, py);
      context.stroke();
      context.fillText(fmtValue(tick), PAD.left - 6, py);
    }
    context.textAlign = "center";
    context.textBaseline = "top";
    const span = layout.xHigh - layout.xLow;
    const xTicks = niceTicks(layout.xLow, layout.xHigh, Math.max(2, Math.floor(layout.plotWidth / 80)))
      .filter((t) => Number.isInteger(t) || span > 10);
    for (const tick of xTicks) context.fillText(fmtStep(tick), layout.x(tick), layout.height - PAD.bottom + 6);
    context.strokeStyle = "#c9d1da";
    context.beginPath();
    context.moveTo(PAD.left, layout.height - PAD.bottom + 0.5);
    context.lineTo(layout.width - PAD.right, layout.height - PAD.bottom + 0.5);
    context.stroke();
  }

  drawMarkers(context, layout) {
    context.strokeStyle = "#dc2626";
    context.lineWidth = 1.5;
    context.setLineDash([4, 3]);
    for (const marker of this.group.markers) {
      if (!isNumber(marker.step) || marker.step < layout.xLow || marker.step > layout.xHigh) continue;
      const px = Math.round(layout.x(marker.step)) + 0.5;
      context.beginPath();
      context.moveTo(px, PAD.top);
      context.lineTo(px, layout.height - PAD.bottom);
      context.stroke();
    }
    context.setLineDash([]);
  }

  /** The crosshair, the points under it, the tooltip (on the hovered chart) and the zoom box. */
  drawOverlay(showTooltip) {
    const { context } = this.sizeCanvas(this.overlay);
    const layout = this.layout;
    this.tooltip.hidden = true;
    this.updateHeader();
    if (!layout) return;
    if (this.drag && Math.abs(this.drag.current - this.drag.start) > 2) {
      context.fillStyle = "rgba(37, 99, 235, 0.12)";
      const left = Math.min(this.drag.start, this.drag.current);
      context.fillRect(left, PAD.top, Math.abs(this.drag.current - this.drag.start), layout.plotHeight);
    }
    const step = this.group.hoverStep;
    if (step === null || step < layout.xLow || step > layout.xHigh) return;
    const px = Math.round(layout.x(step)) + 0.5;
    context.strokeStyle = "rgba(28, 36, 48, 0.45)";
    context.lineWidth = 1;
    context.beginPath();
    context.moveTo(px, PAD.top);
    context.lineTo(px, layout.height - PAD.bottom);
    context.stroke();
    const rows = [];
    for (const s of this.series) {
      const trace = s.trace;
      if (!trace) continue;
      const at = nearestIndex(trace.steps, step);
      const shown = trace.line[at];
      if (!Number.isFinite(shown)) continue;
      context.fillStyle = s.color;
      context.beginPath();
      context.arc(layout.x(trace.steps[at]), layout.y(shown), 4, 0, 2 * Math.PI);
      context.fill();
      rows.push({ series: s, trace, at, shown });
    }
    if (showTooltip && rows.length) this.showTooltip(step, rows, px);
  }

  showTooltip(step, rows, px) {
    const lines = [h("div", { className: "t-step" }, this.group.formatX(step))];
    for (const { series, trace, at, shown } of rows) {
      const label = series.label.length > 24 ? `${series.label.slice(0, 23)}…` : series.label;
      let text;
      if (trace.dense) {
        text = `${fmtValue(shown)}, range ${fmtValue(trace.low[at])} to ${fmtValue(trace.high[at])}`;
      } else {
        const raw = series.values[nearestIndex(series.steps, step)];
        text = trace.smoothed ? `${fmtValue(raw)}, smoothed ${fmtValue(shown)}` : fmtValue(raw);
      }
      lines.push(h("div", { className: series.id === "main" ? "t-main" : "t-cmp" },
        h("div", {}, label), h("b", {}, text)));
    }
    for (const marker of this.group.markers) {
      if (this.layout && Math.abs(this.layout.x(marker.step) - px) < 6) {
        lines.push(h("div", { className: "t-alarm" }, `alarm at step ${marker.step}: ${marker.label}`));
      }
    }
    this.tooltip.replaceChildren(...lines);
    this.tooltip.hidden = false;
    // beside the crosshair, on the side with room; clamped inside the chart when neither has
    const boxWidth = this.canvasBox.clientWidth;
    const tipWidth = this.tooltip.offsetWidth;
    let left = px + 12;
    if (left + tipWidth > boxWidth) left = px - 12 - tipWidth;
    if (left < 0) left = px > boxWidth / 2 ? 0 : boxWidth - tipWidth;
    this.tooltip.style.left = `${Math.max(0, left)}px`;
    this.tooltip.style.top = "6px";
  }

  /** The header shows each run's drawn value at the hovered step, else at the last step. */
  updateHeader() {
    const parts = [];
    for (const s of this.series) {
      const trace = s.trace;
      if (!trace || !trace.steps.length) continue;
      const step = this.group.hoverStep;
      const at = step === null ? trace.steps.length - 1 : nearestIndex(trace.steps, step);
      const text = fmtValue(trace.line[at]);
      // each other run's value in its own line colour (the compare page draws up to 8)
      parts.push(s.id === "main" ? h("span", {}, text)
        : h("span", { className: "cmp", style: { color: s.color } }, text));
    }
    this.valueLabel.replaceChildren(...parts);
  }

  // --- mouse ----------------------------------------------------------------------------

  bindEvents() {
    const position = (event) => {
      const box = this.overlay.getBoundingClientRect();
      return event.clientX - box.left;
    };
    this.overlay.addEventListener("mousemove", (event) => {
      if (!this.layout) return;
      const px = position(event);
      if (this.drag) this.drag.current = px;
      const step = this.layout.stepAt(px);
      const main = this.series.find((s) => s.id === "main") || this.series[0];
      const index = main ? nearestIndex(main.steps, step) : -1;
      this.group.setHover(index >= 0 ? main.steps[index] : Math.round(step), this);
    });
    this.overlay.addEventListener("mouseleave", () => {
      this.drag = null;
      this.group.setHover(null, this);
    });
    this.overlay.addEventListener("mousedown", (event) => {
      this.drag = { start: position(event), current: position(event) };
    });
    this.overlay.addEventListener("mouseup", () => {
      const drag = this.drag;
      this.drag = null;
      if (!drag || !this.layout || Math.abs(drag.current - drag.start) < 6) {
        this.drawOverlay(true);
        return;
      }
      const low = this.layout.stepAt(Math.min(drag.start, drag.current));
      const high = this.layout.stepAt(Math.max(drag.start, drag.current));
      this.group.setXRange([low, high]);
    });
    this.overlay.addEventListener("dblclick", () => this.group.setXRange(null));
  }
}
