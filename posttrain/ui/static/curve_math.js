// Pure functions behind the charts: smoothing, axis ticks, nearest point. No DOM here,
// so they can be checked with numbers (tests/test_dashboard.py imports this module in
// the browser and pins smoothEMA to TensorBoard's values).

/**
 * Debiased exponential moving average (TensorBoard's scalar smoothing):
 * s_t = w * s_{t-1} + (1 - w) * x_t with s_0 = 0, shown as s_t / (1 - w^t).
 * weight 0 returns the values unchanged. Non-finite values are carried through.
 * Pins (dashboards-stats-style.md A.7): w=0.6 on [1,0,1,0,1] ->
 * [1, 0.375, 0.693878, 0.375, 0.646079]; w=0.9 on [2,4,6] -> [2, 3.052632, 4.140221].
 */
export function smoothEMA(values, weight) {
  const out = new Array(values.length);
  if (!(weight > 0)) {
    for (let i = 0; i < values.length; i++) out[i] = values[i];
    return out;
  }
  let last = 0;
  let count = 0;
  for (let i = 0; i < values.length; i++) {
    const value = values[i];
    if (!Number.isFinite(value)) {
      out[i] = value;
      continue;
    }
    last = last * weight + (1 - weight) * value;
    count += 1;
    out[i] = last / (1 - Math.pow(weight, count));
  }
  return out;
}

/** About `count` round tick values (1, 2 or 5 times a power of ten) covering [low, high]. */
export function niceTicks(low, high, count = 5) {
  if (!(high > low)) return [low];
  const raw = (high - low) / Math.max(1, count);
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) || 10 * power;
  const ticks = [];
  for (let tick = Math.ceil(low / step) * step; tick <= high + step * 1e-9; tick += step) {
    ticks.push(Math.abs(tick) < step * 1e-9 ? 0 : tick);
  }
  return ticks;
}

/** Index of the point whose step is nearest `step` (steps sorted ascending); -1 if empty. */
export function nearestIndex(steps, step) {
  if (!steps.length) return -1;
  let low = 0;
  let high = steps.length - 1;
  while (low < high) {
    const mid = (low + high) >> 1;
    if (steps[mid] < step) low = mid + 1;
    else high = mid;
  }
  if (low > 0 && Math.abs(steps[low - 1] - step) <= Math.abs(steps[low] - step)) return low - 1;
  return low;
}
