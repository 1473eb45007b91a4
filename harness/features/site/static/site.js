// The results site's only script: the matrix filters and the what-changed view. No library, no
// network: the data is in the page.
"use strict";

function filterMatrix(form) {
  const v = (name) => (form.elements[name] ? form.elements[name].value : "");
  const engine = v("engine"), model = v("model"), section = v("section");
  const device = v("device"), status = v("status"), q = v("q").trim().toLowerCase();
  let shown = 0;
  document.querySelectorAll("#matrix [data-col]").forEach((el) => {
    el.classList.toggle("hidecol", engine !== "" && el.dataset.col !== engine);
  });
  document.querySelectorAll("#matrix tr.frow").forEach((tr) => {
    const rowOk = (!model || tr.dataset.model === model) && (!section || tr.dataset.section === section)
      && (!q || tr.dataset.search.includes(q));
    let any = false;
    tr.querySelectorAll("td.cell").forEach((td) => {
      const ok = (!engine || td.dataset.col === engine) && (!device || td.dataset.device === device)
        && (!status || td.dataset.state === status);
      td.classList.toggle("dim", !ok);
      if (ok && td.dataset.state !== "na") any = true;
    });
    tr.hidden = !(rowOk && any);
    if (!tr.hidden) shown += 1;
  });
  document.querySelectorAll("#matrix tbody").forEach((tb) => {
    tb.hidden = !tb.querySelector("tr.frow:not([hidden])");
  });
  const out = document.getElementById("shown");
  if (out) out.textContent = shown + " rows shown";
}

function asOf(points, order) {
  let best = null;
  for (const p of points) if (p[0] <= order) best = p;  // points are oldest first
  return best;
}

function cellLink(p) {
  if (!p) return document.createTextNode("—");
  const a = document.createElement("a");
  a.href = "records/" + p[3];
  a.textContent = p[2];
  a.className = "st-" + p[1];
  return a;
}

function showChanges(form, data) {
  const a = Number(form.elements.a.value), b = Number(form.elements.b.value);
  const body = document.querySelector("#changes tbody");
  body.replaceChildren();
  let n = 0;
  for (const c of data.cells) {
    const pa = asOf(c.points, a), pb = asOf(c.points, b);
    if ((pa ? pa[2] : "") === (pb ? pb[2] : "")) continue;
    if (form.elements.both.checked && !(pa && pb)) continue;
    n += 1;
    const tr = document.createElement("tr");
    for (const text of [c.row, c.model, c.col]) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.appendChild(td);
    }
    for (const p of [pa, pb]) {
      const td = document.createElement("td");
      td.appendChild(cellLink(p));
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
  document.getElementById("flipped").textContent = n + " cells changed";
}

document.addEventListener("DOMContentLoaded", () => {
  const filters = document.getElementById("filters");
  if (filters && document.getElementById("matrix")) {
    filters.addEventListener("input", () => filterMatrix(filters));
    filters.addEventListener("change", () => filterMatrix(filters));
    filterMatrix(filters);
  }
  const compare = document.getElementById("compare");
  const raw = document.getElementById("changes-data");
  if (compare && raw) {
    const data = JSON.parse(raw.textContent);
    compare.addEventListener("change", () => showChanges(compare, data));
    showChanges(compare, data);
  }
});
