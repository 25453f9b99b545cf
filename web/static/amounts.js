/* adbill: beside an amount typed in currency units (a price, a daily budget), the integer micros it is stored as.
   Exact: the digits are moved, never multiplied as a floating-point number (web/ad_catalog.py converts alike). */
"use strict";

// `digits`: the decimals allowed (6, the micro, for a price; the currency's minor unit for a budget).
function amountMicros(text, digits) {
  const m = /^\s*([+-]?)(\d+)(?:\.(\d{1,6}))?\s*$/.exec(text);
  if (!m || (m[3] || "").length > digits) return null;
  const micros = (m[2] + (m[3] || "").padEnd(6, "0")).replace(/^0+(?=\d)/, "");
  return (m[1] === "-" && micros !== "0" ? "-" : "") + micros;
}

function groupDigits(digits) {
  return digits.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

document.addEventListener("DOMContentLoaded", () => {
  for (const input of document.querySelectorAll("input[data-micros-preview]")) {
    const out = document.getElementById(input.dataset.microsPreview);
    if (!out) continue;
    const show = () => {
      const value = input.value.trim();
      if (!value) {
        out.textContent = "";
        return;
      }
      const digits = input.dataset.digits === undefined ? 6 : Number(input.dataset.digits);
      const micros = amountMicros(value, digits);
      const rule = digits === 0 ? "in whole " + (input.dataset.currency || "units") : "with at most " + digits + " decimals";
      const bad = micros === null || micros.startsWith("-");
      out.textContent = micros === null ? "not an amount " + rule : bad ? "must not be negative" : "= " + groupDigits(micros) + " micros stored";
      out.classList.toggle("bad", bad);
    };
    input.addEventListener("input", show);
    show();
  }
});
