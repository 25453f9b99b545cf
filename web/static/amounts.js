/* adbill: beside an amount typed in currency units (a price, a daily budget), the integer micros it is stored as.
   Exact: the digits are moved, never multiplied as a floating-point number (web/ad_catalog.py converts alike). */
"use strict";

function amountMicros(text) {
  const m = /^\s*([+-]?)(\d+)(?:\.(\d{1,6}))?\s*$/.exec(text);
  if (!m) return null;
  const digits = (m[2] + (m[3] || "").padEnd(6, "0")).replace(/^0+(?=\d)/, "");
  return (m[1] === "-" && digits !== "0" ? "-" : "") + digits;
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
      const micros = amountMicros(value);
      out.textContent = micros === null ? "not an amount with at most 6 decimals" : "= " + groupDigits(micros) + " micros stored";
      out.classList.toggle("bad", micros === null);
    };
    input.addEventListener("input", show);
    show();
  }
});
