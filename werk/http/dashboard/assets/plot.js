// Werk dashboard: the host-memory plot (an SVG polyline) and its text alternative.

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 600;
const HEIGHT = 120;
export const WINDOW_SECONDS = 600;

const samples = [];

export function addSample(time, usedPercent) {
  if (usedPercent === null || usedPercent === undefined) return;
  samples.push([time, usedPercent]);
  while (samples.length && samples[0][0] < time - WINDOW_SECONDS * 1000) samples.shift();
}

export function drawPlot(svg, caption, thresholds) {
  for (const node of Array.from(svg.querySelectorAll("polyline, line"))) node.remove();
  for (const t of thresholds) {
    const y = HEIGHT - (t / 100) * HEIGHT;
    const line = document.createElementNS(SVG, "line");
    line.setAttribute("x1", "0"); line.setAttribute("x2", String(WIDTH));
    line.setAttribute("y1", String(y)); line.setAttribute("y2", String(y));
    svg.append(line);
  }
  if (!samples.length) { caption.textContent = "Collecting samples…"; return; }
  const end = samples[samples.length - 1][0];
  const start = end - WINDOW_SECONDS * 1000;
  const points = samples.map(([t, p]) => {
    const x = ((t - start) / (WINDOW_SECONDS * 1000)) * WIDTH;
    const y = HEIGHT - (Math.min(100, Math.max(0, p)) / 100) * HEIGHT;
    return `${x.toFixed(1)},${y.toFixed(1)}`;
  });
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", points.join(" "));
  svg.append(line);
  const values = samples.map(([, p]) => p);
  const minutes = Math.max(1, Math.round((end - samples[0][0]) / 60000));
  caption.textContent =
    `Host memory used over the last ${minutes} min: now ${values[values.length - 1].toFixed(1)} %, ` +
    `lowest ${Math.min(...values).toFixed(1)} %, highest ${Math.max(...values).toFixed(1)} % ` +
    `(dashed lines: pressure thresholds ${thresholds.join(", ")} %).`;
}
