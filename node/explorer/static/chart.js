// A small SVG line chart for training curves: one series per worker, x = step, y = value.
(function () {
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const SERIES_COLORS = ["#2a62d9", "#d9822b", "#17844a", "#8e44ad", "#c0392b", "#16a0a6", "#7f8c8d", "#b7950b"];

function svgEl(name, attrs) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, String(value));
  return el;
}

function niceNumber(value) {
  if (!Number.isFinite(value)) return "";
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 0.001 || abs >= 1e5)) return value.toExponential(1);
  return String(Math.round(value * 1000) / 1000);
}

// series: [{name, points: [[x, y], ...]}]; returns an <svg> element (class "chart") with a <path
// class="series"> per series that has at least one finite point.
function lineChart(title, series, width = 420, height = 220) {
  const pad = {left: 48, right: 10, top: 22, bottom: 26};
  const svg = svgEl("svg", {width, height, viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img"});
  svg.setAttribute("aria-label", title);
  const label = svgEl("text", {x: pad.left, y: 14});
  label.textContent = title;
  svg.appendChild(label);
  const finite = series.map((s) => ({name: s.name,
    points: s.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y))}))
    .filter((s) => s.points.length > 0);
  const all = finite.flatMap((s) => s.points);
  const plotW = width - pad.left - pad.right, plotH = height - pad.top - pad.bottom;
  svg.appendChild(svgEl("line", {x1: pad.left, y1: pad.top + plotH, x2: pad.left + plotW, y2: pad.top + plotH,
    class: "axis"}));
  svg.appendChild(svgEl("line", {x1: pad.left, y1: pad.top, x2: pad.left, y2: pad.top + plotH, class: "axis"}));
  if (all.length === 0) {
    const empty = svgEl("text", {x: pad.left + 10, y: pad.top + plotH / 2});
    empty.textContent = "no data yet";
    svg.appendChild(empty);
    return svg;
  }
  let [xMin, xMax] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [yMin, yMax] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  if (xMax === xMin) { xMin -= 1; xMax += 1; }
  if (yMax === yMin) { yMax += Math.abs(yMax) * 0.05 + 0.01; yMin -= Math.abs(yMin) * 0.05 + 0.01; }
  const sx = (x) => pad.left + ((x - xMin) / (xMax - xMin)) * plotW;
  const sy = (y) => pad.top + plotH - ((y - yMin) / (yMax - yMin)) * plotH;
  for (let i = 0; i <= 4; i++) {
    const y = yMin + ((yMax - yMin) * i) / 4;
    svg.appendChild(svgEl("line", {x1: pad.left, y1: sy(y), x2: pad.left + plotW, y2: sy(y), class: "grid"}));
    const tick = svgEl("text", {x: 2, y: sy(y) + 3});
    tick.textContent = niceNumber(y);
    svg.appendChild(tick);
  }
  for (const x of [xMin, (xMin + xMax) / 2, xMax]) {
    const tick = svgEl("text", {x: sx(x) - 8, y: height - 8});
    tick.textContent = String(Math.round(x));
    svg.appendChild(tick);
  }
  finite.forEach((s, i) => {
    const d = s.points.map(([x, y], j) => `${j ? "L" : "M"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" ");
    const path = svgEl("path", {d, class: "series", stroke: SERIES_COLORS[i % SERIES_COLORS.length]});
    path.setAttribute("data-series", s.name);
    svg.appendChild(path);
    if (s.points.length <= 40) {   // sparse series (eval metrics): mark each point
      for (const [x, y] of s.points) {
        svg.appendChild(svgEl("circle", {cx: sx(x).toFixed(1), cy: sy(y).toFixed(1), r: 2.5,
          fill: SERIES_COLORS[i % SERIES_COLORS.length]}));
      }
    }
  });
  return svg;
}

function chartLegend(names) {
  const div = document.createElement("div");
  div.className = "legend";
  names.forEach((name, i) => {
    const span = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = SERIES_COLORS[i % SERIES_COLORS.length];
    span.appendChild(swatch);
    span.appendChild(document.createTextNode(name));
    div.appendChild(span);
  });
  return div;
}

window.dekubeChart = {lineChart, chartLegend};
})();
