// adbill's only script: live refresh of an advertiser's dashboard and its spend chart, from the JSON API.
// Loaded from this origin (the Content-Security-Policy allows no inline script). Money arrives as integer micros
// written as JSON strings ("9007199254740993": a JSON number past 2^53 would lose digits in response.json()), is
// read into BigInt and formatted with integer arithmetic, as web/display.py does on the server.
"use strict";

const MICROS = 1000000n;

// As web/display.py (Babel): the currency's decimals (`digits`, 2 unless the page says otherwise) where the amount
// is whole cents, every digit down to the micro where it is not, and the currency's code.
let currencyDigits = 2; // the page's currency's decimals: data-currency-digits of #dashboard

function money(micros, currency, digits) {
  const keep = digits === undefined ? currencyDigits : Number(digits);
  const value = BigInt(micros);
  const abs = value < 0n ? -value : value;
  const units = (abs / MICROS).toLocaleString("en-US");
  let fraction = (abs % MICROS).toString().padStart(6, "0");
  while (fraction.length > keep && fraction.endsWith("0")) fraction = fraction.slice(0, -1);
  const text = (value < 0n ? "-" : "") + units + (fraction ? "." + fraction : "");
  return currency ? text + " " + currency : text;
}

function signedMoney(micros, currency, digits) {
  return (BigInt(micros) > 0n ? "+" : "") + money(micros, currency, digits);
}

function count(n) {
  return BigInt(n).toLocaleString("en-US");
}

function signedCount(n) {
  return (BigInt(n) > 0n ? "+" : "") + count(n);
}

function periodLabel(key) {
  if (key.length !== 14) return key;
  return key.slice(0, 4) + "-" + key.slice(4, 6) + "-" + key.slice(6, 8) + " " + key.slice(9, 11) + ":" + key.slice(11, 13) + " UTC";
}

// The pages' one time format: 2026-01-01 00:00:05 UTC (web/display.py `utc`).
function utcText(ms) {
  return new Date(ms).toISOString().slice(0, 19).replace("T", " ") + " UTC";
}

// The banner that says when the data was last billed (web/templates/_freshness.html), from the API's document.
function showFreshness(freshness) {
  const banner = document.getElementById("freshness");
  if (!banner || !freshness) return;
  banner.className = "freshness " + freshness.level;
  banner.dataset.level = freshness.level;
  const text = banner.querySelector(".freshness-text");
  if (text) text.textContent = freshness.text;
}

function lookup(row, path) {
  return path.split(".").reduce((value, part) => (value == null ? undefined : value[part]), row);
}

function render(value, format, currency) {
  switch (format) {
    case "money": return money(value, currency);
    case "signed_money": return signedMoney(value, currency);
    case "count": return count(value);
    case "signed_count": return signedCount(value);
    case "period": return periodLabel(value);
    case "budget": return value == null ? "unlimited" : money(value, currency);
    default: return value == null ? "" : String(value);
  }
}

function spanBadge(closed) {
  const span = document.createElement("span");
  span.className = "badge " + (closed ? "closed" : "open");
  span.textContent = closed ? "closed" : "provisional";
  return span;
}

function statusBadge(closed) {
  const span = document.createElement("span");
  span.className = "badge " + (closed ? "closed" : "open");
  span.textContent = closed ? "closed" : "open";
  return span;
}

// A table's header cells say which value each column shows (data-k) and how (data-f); rows are rebuilt from them.
function fillTable(table, rows, currency) {
  const heads = Array.from(table.querySelectorAll("thead th"));
  const body = document.createElement("tbody");
  const ordered = table.dataset.reverse ? rows.slice().reverse() : rows;
  for (const row of ordered) {
    const tr = document.createElement("tr");
    for (const th of heads) {
      const td = document.createElement("td");
      const value = lookup(row, th.dataset.k);
      if (th.classList.contains("num")) td.className = "num";
      if (th.classList.contains("name")) td.className = "name";
      td.dataset.label = th.textContent.trim();
      if (th.dataset.f === "status") {
        td.appendChild(statusBadge(value));
      } else if (th.dataset.f === "span_status") {
        td.appendChild(spanBadge(value));
      } else if (th.dataset.f === "capped") {
        // A campaign's day that left no room under its budget (web/templates/_macros.html, budget_day_table).
        if (value) {
          const badge = document.createElement("span");
          badge.className = "badge capped";
          badge.textContent = "capped";
          td.appendChild(badge);
          tr.className = "capped";
        }
      } else if (th.dataset.f === "budget") {
        td.textContent = render(value, "budget", currency);
        if (row.budgets && row.budgets.length > 1) {
          const note = document.createElement("span");
          note.className = "muted";
          note.textContent = " (changed)";
          td.appendChild(note);
        }
      } else if (th.dataset.link) {
        const a = document.createElement("a");
        a.href = th.dataset.link.replace("__ID__", encodeURIComponent(value));
        a.textContent = render(value, th.dataset.f, currency);
        td.appendChild(a);
      } else {
        td.textContent = render(value, th.dataset.f, currency);
      }
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
  table.replaceChild(body, table.querySelector("tbody"));
}

const SVG = "http://www.w3.org/2000/svg";

function svgElement(name, attributes, text) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, String(value));
  if (text !== undefined) element.textContent = text;
  return element;
}

// Bars: corrected spend per period; line: provisional spend. Heights are proportional to micros.
function drawChart(svg, series, currency) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  // Drawn at the width it is shown at, so that its labels are the page's size on a phone as on a desktop.
  const width = Math.round(Math.min(760, Math.max(300, svg.clientWidth || 760)));
  const height = 260, left = width < 500 ? 78 : 110, right = 10, top = 12, bottom = 34;
  svg.setAttribute("viewBox", "0 0 " + width + " " + height);
  const axisLabel = (key) => (width < 500 ? periodLabel(key).slice(5, 16) : periodLabel(key));
  const plotW = width - left - right, plotH = height - top - bottom;
  svg.setAttribute("data-points", String(series.length));
  if (series.length === 0) {
    svg.appendChild(svgElement("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "axis" }, "No spend yet"));
    return;
  }
  let max = 1n;
  for (const p of series) {
    for (const micros of [BigInt(p.corrected.micros), BigInt(p.provisional.micros)]) if (micros > max) max = micros;
  }
  const step = plotW / series.length;
  // Heights only: the share of the highest bar, in millionths, exact in BigInt before it becomes a Number.
  const share = (micros) => { const m = BigInt(micros); return m > 0n ? Number((m * 1000000n) / max) / 1e6 : 0; };
  const y = (micros) => top + plotH - share(micros) * plotH;
  svg.appendChild(svgElement("line", { x1: left, y1: top + plotH, x2: width - right, y2: top + plotH, class: "axis-line" }));
  svg.appendChild(svgElement("line", { x1: left, y1: top, x2: left, y2: top + plotH, class: "axis-line" }));
  svg.appendChild(svgElement("text", { x: left - 6, y: top + 4, "text-anchor": "end", class: "axis" }, money(max, currency).replace(/\.\d+/, "")));
  svg.appendChild(svgElement("text", { x: left - 6, y: top + plotH, "text-anchor": "end", class: "axis" }, "0"));
  const bars = svgElement("g", { class: "bars" });
  const points = [];
  series.forEach((p, i) => {
    const x = left + i * step;
    const bar = svgElement("rect", {
      x: (x + step * 0.15).toFixed(2), y: y(p.corrected.micros).toFixed(2),
      width: Math.max(1, step * 0.7).toFixed(2), height: (top + plotH - y(p.corrected.micros)).toFixed(2),
      class: "bar" + (p.closed ? " closed" : ""), "data-period": p.period, "data-micros": p.corrected.micros,
    });
    bar.appendChild(svgElement("title", {}, periodLabel(p.period) + ": " + money(p.corrected.micros, currency)));
    bars.appendChild(bar);
    points.push((x + step / 2).toFixed(2) + "," + y(p.provisional.micros).toFixed(2));
  });
  svg.appendChild(bars);
  svg.appendChild(svgElement("polyline", { points: points.join(" "), class: "provisional-line" }));
  svg.appendChild(svgElement("text", { x: left, y: height - 10, class: "axis" }, axisLabel(series[0].period)));
  if (series.length > 1) { // one period has one label, not the same one twice
    svg.appendChild(svgElement("text", { x: width - right, y: height - 10, "text-anchor": "end", class: "axis" },
      axisLabel(series[series.length - 1].period)));
  }
}

function refreshDashboard(root) {
  const currency = root.dataset.currency;
  // Marked as background: an open dashboard alone does not keep an idle session alive (web/sessions.py).
  const headers = { Accept: "application/json", "X-Adbill-Background": "refresh" };
  return fetch(root.dataset.api, { credentials: "same-origin", headers })
    .then((response) => {
      if (response.status === 401) { window.location.reload(); throw new Error("logged out"); }
      if (!response.ok) throw new Error("HTTP " + response.status);
      return response.json();
    })
    .then((data) => {
      for (const cell of root.querySelectorAll("[data-k]:not(th)")) {
        if (cell.closest("table[data-rows]")) continue;
        const value = lookup(data, cell.dataset.k);
        if (value !== undefined) cell.textContent = render(value, cell.dataset.f, currency);
      }
      for (const table of root.querySelectorAll("table[data-rows]")) {
        fillTable(table, data[table.dataset.rows] || [], currency);
      }
      const chart = document.getElementById("spend-chart");
      if (chart) drawChart(chart, data.series || [], currency);
      root.dataset.refreshes = String(Number(root.dataset.refreshes || "0") + 1);
      const status = document.getElementById("refresh-status");
      if (status) status.textContent = "page updated " + utcText(Date.now());
      showFreshness(data.freshness);
    })
    .catch((error) => {
      const status = document.getElementById("refresh-status");
      if (status) status.textContent = "could not refresh: " + error.message;
    });
}

// A table read as one card per row on a phone (`stack`, adbill.css) names each value by its column's header.
function labelCells(table) {
  const heads = Array.from(table.querySelectorAll("thead th")).map((th) => th.textContent.trim());
  for (const tr of table.querySelectorAll("tbody tr")) {
    Array.from(tr.children).forEach((td, i) => {
      if (!td.dataset.label && heads[i] && td.colSpan === 1) td.dataset.label = heads[i];
    });
  }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const table of document.querySelectorAll("table.stack")) labelCells(table);
  const root = document.getElementById("dashboard");
  if (!root) return;
  if (root.dataset.currencyDigits) currencyDigits = Number(root.dataset.currencyDigits);
  const every = Number(root.dataset.refreshMs || "3000");
  const tick = () => refreshDashboard(root).finally(() => window.setTimeout(tick, every));
  tick();
});
