// The dashboard's page: polls the JSON API every second and draws what it says.
// Every string shown came from the store (job ids, errors, counter names, worker ids):
// it goes into the page as text (textContent), never as markup, and into the chart, which
// draws on a canvas. Nothing here builds HTML from data.
"use strict";

const POLL_MS = 1000;
const PAGE = 50;
const MAX_ROWS = 200; // attempts listed under a step's timeline (the chart shows them all)
const COLOURS = {
  running: "#1d5fb4",
  committed: "#1b7a3a",
  lost: "#9aa4ad",
  released: "#7a4fb0",
  failed: "#c01c28",
  abandoned: "#d98a00",
};

const view = { offset: 0, job: null, polls: 0 };
const charts = new Map(); // step job id -> its timeline chart

function $(id) {
  return document.getElementById(id);
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
  return tr;
}

function num(n) {
  return typeof n === "number" && isFinite(n) ? n : null;
}

function clock(t) {
  if (num(t) === null) return "";
  const d = new Date(t * 1000);
  return d.toLocaleString(undefined, { hour12: false });
}

function span(s) {
  if (num(s) === null) return "";
  if (s < 60) return s.toFixed(1) + " s";
  const i = Math.floor(s);
  if (i < 3600) return Math.floor(i / 60) + " min " + (i % 60) + " s";
  return Math.floor(i / 3600) + " h " + Math.floor((i % 3600) / 60) + " min";
}

function count(n) {
  return num(n) === null ? "" : n.toLocaleString();
}

function rate(mbs) {
  if (num(mbs) === null) return "";
  return mbs >= 100 ? mbs.toFixed(0) : mbs.toPrecision(2);
}

function replaceRows(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function fieldRows(tbody, pairs) {
  replaceRows(
    tbody,
    pairs.map(([k, v]) => row([el("th", k), el("td", v)])),
  );
}

async function getJson(path) {
  const r = await fetch(path, { cache: "no-store" });
  let doc = null;
  try {
    doc = await r.json();
  } catch (e) {
    doc = null;
  }
  if (!r.ok) {
    const why = doc && typeof doc.error === "string" ? doc.error : r.status + " " + r.statusText;
    throw new Error(path + ": " + why);
  }
  return doc;
}

function stateCell(state) {
  return el("td", state, "state-" + String(state).replace(/[^a-z]/g, ""));
}

function progressText(p, done, all) {
  if (!p) return "";
  return count(p[done]) + "/" + count(p[all]);
}

function dupSum(d, method) {
  if (!d || !d[method]) return "";
  return count(Object.values(d[method]).reduce((a, b) => a + (num(b) || 0), 0));
}

function drawJobs(doc) {
  if (typeof doc.store === "string") $("store").textContent = doc.store;
  const states = Object.entries(doc.states || {})
    .map(([k, v]) => v + " " + k)
    .join(", ");
  $("states").textContent = states ? "(" + states + ")" : "";
  const rows = (doc.jobs || []).map((j) => {
    const link = el("a", j.job);
    link.href = "#job=" + encodeURIComponent(String(j.job));
    const idCell = el("td", null, "id");
    idCell.appendChild(link);
    const tr = row([
      idCell,
      stateCell(j.state),
      el("td", j.steps > 1 ? j.step + "/" + j.steps : "", "num"),
      el("td", progressText(j.progress, "maps_done", "maps"), "num"),
      el("td", progressText(j.progress, "reduces_done", "reduces"), "num"),
      el("td", clock(j.started)),
      el("td", clock(j.ended)),
      el("td", span(j.duration_s) + (j.ended || j.state !== "running" ? "" : " so far"), "num"),
      el("td", rate(j.throughput_mb_s), "num"),
      el("td", dupSum(j.duplicates, "method1"), "num"),
      el("td", dupSum(j.duplicates, "method2"), "num"),
      el("td", dupSum(j.duplicates, "method3"), "num"),
      el("td", j.error, "msg"),
    ]);
    tr.dataset.job = String(j.job);
    tr.dataset.state = String(j.state);
    if (j.job === view.job) tr.className = "selected";
    return tr;
  });
  replaceRows($("jobs").tBodies[0], rows);
  const total = num(doc.total) || 0;
  const first = total ? view.offset + 1 : 0;
  const last = Math.min(total, view.offset + rows.length);
  $("range").textContent = "jobs " + first + "–" + last + " of " + total.toLocaleString();
  $("newer").disabled = view.offset <= 0;
  $("older").disabled = view.offset + PAGE >= total;
}

function drawWorkers(doc) {
  const rows = (doc.workers || []).map((w) =>
    row([
      el("td", w.worker, "id"),
      el("td", w.host),
      el("td", w.pid, "num"),
      el("td", w.busy, "num"),
      el("td", w.slots ? w.slots.map + " map, " + w.slots.reduce + " reduce" : ""),
      el("td", count(w.tasks_done), "num"),
      el("td", (w.jobs || []).join(" "), "id"),
      el("td", clock(w.started)),
      el("td", span(w.silent_s) + " ago", "num"),
      el("td", clock(w.stopped)),
    ]),
  );
  replaceRows($("workers").tBodies[0], rows);
  const total = num(doc.total) || 0;
  $("workers-count").textContent = total > rows.length ? "(the latest " + rows.length + " of " + total + ")" : "";
}

function usd(n) {
  if (num(n) === null) return "";
  return "$" + (n >= 1 ? n.toFixed(2) : n.toPrecision(3));
}

// cmr.cost's JobCost.to_json(): total_usd, services {name, requests, usd}, worker_seconds,
// workers_usd, prices {date}.
function costRows(cost) {
  if (!cost || typeof cost !== "object") return [["cost", "not known for this store"]];
  const pairs = [["total", usd(cost.total_usd)]];
  for (const s of Object.values(cost.services || {})) {
    if (s && typeof s === "object") pairs.push([String(s.name), usd(s.usd) + " (" + count(s.requests) + " requests)"]);
  }
  if (num(cost.worker_seconds) !== null) {
    pairs.push(["workers", usd(cost.workers_usd) + " (" + cost.worker_seconds.toFixed(1) + " worker-seconds)"]);
  }
  if (cost.prices && typeof cost.prices.date === "string") pairs.push(["prices of", cost.prices.date]);
  return pairs;
}

function drawDetail(doc) {
  $("detail").hidden = false;
  $("detail-job").textContent = doc.job;
  const p = doc.progress || {};
  fieldRows($("fields").tBodies[0], [
    ["state", doc.state],
    ["started", clock(doc.started)],
    ["ended", clock(doc.ended)],
    ["duration", span(doc.duration_s) + (doc.ended ? "" : doc.state === "running" ? " so far" : "")],
    ["maps", progressText(p, "maps_done", "maps")],
    ["reduces", progressText(p, "reduces_done", "reduces")],
    ["throughput", rate(doc.throughput_mb_s) + (num(doc.throughput_mb_s) === null ? "" : " MB/s")],
    ["input", doc.input],
    ["output", doc.output],
    ["records in / out", count(doc.records_in) + " / " + count(doc.records_out)],
  ]);
  const d = doc.duplicates || {};
  const dup = [];
  const names = { method1: "1 filter results", method2: "2 tag and remember", method3: "3 claim and resolve" };
  for (const [m, label] of Object.entries(names)) {
    for (const [k, v] of Object.entries(d[m] || {})) dup.push([label + ": " + k, count(v)]);
  }
  fieldRows($("duplicates").tBodies[0], dup);
  const cs = [];
  for (const [group, names2] of Object.entries(doc.counters || {})) {
    for (const [name, v] of Object.entries(names2 || {})) cs.push([group + " / " + name, count(v)]);
  }
  fieldRows($("counters").tBodies[0], cs.length ? cs : [["", "none"]]);
  fieldRows($("cost").tBodies[0], costRows(doc.cost));
  $("job-error").hidden = !doc.error;
  $("job-error").textContent = doc.error || "";
  drawSteps(doc);
}

function stepBox(step) {
  const id = "step-" + step.job;
  let box = document.getElementById(id);
  if (box) return box;
  box = el("div", null, "step");
  box.id = id;
  box.appendChild(el("h3"));
  const holder = el("div", null, "timeline");
  holder.appendChild(document.createElement("canvas"));
  box.appendChild(holder);
  box.appendChild(el("h3", "Failures"));
  const failures = el("table", null, "failures");
  failures.appendChild(el("tbody"));
  box.appendChild(failures);
  box.appendChild(el("h3", "Attempts"));
  const table = el("table", null, "attempts");
  const head = el("thead");
  head.appendChild(
    row(["task", "attempt", "worker", "host", "outcome", "backup", "start", "took", "error"].map((t) => el("th", t))),
  );
  table.appendChild(head);
  table.appendChild(el("tbody"));
  box.appendChild(table);
  box.appendChild(el("p", "", "more"));
  $("steps").appendChild(box);
  return box;
}

function label(a) {
  return a.kind + " " + a.task;
}

function drawSteps(doc) {
  const steps = doc.steps || [];
  const keep = new Set(steps.map((s) => "step-" + s.job));
  for (const box of [...$("steps").children]) {
    if (!keep.has(box.id)) {
      const chart = charts.get(box.id);
      if (chart) chart.destroy();
      charts.delete(box.id);
      box.remove();
    }
  }
  const now = num(doc.now) || Date.now() / 1000;
  for (const step of steps) {
    const box = stepBox(step);
    const title = "step " + step.step + ": " + step.job + " — " + step.state + ", " + step.maps + " maps, " + step.reduces + " reduces";
    box.querySelector("h3").textContent = title;
    const tries = step.attempts || [];
    const t0 = Math.min(...tries.map((a) => a.started).filter((t) => num(t) !== null), num(step.started) || now);
    const tasks = [];
    const seen = new Set();
    for (const a of tries) {
      if (!seen.has(label(a))) {
        seen.add(label(a));
        tasks.push(label(a));
      }
    }
    const sets = Object.keys(COLOURS).map((outcome) => ({
      label: outcome,
      backgroundColor: COLOURS[outcome],
      data: tries
        .filter((a) => a.outcome === outcome)
        .map((a) => ({
          x: [a.started - t0, (num(a.ended) === null ? now : a.ended) - t0],
          y: label(a),
          attempt: a,
        })),
      grouped: false,
      barPercentage: 0.8,
      categoryPercentage: 0.9,
    }));
    drawTimeline(box, tasks, sets);
    const failures = (step.failures || []).map((f) =>
      row([el("td", f.kind + " " + f.task), el("td", "failed " + f.failures + ", started " + f.starts), el("td", f.error, "msg")]),
    );
    const failedTries = tries
      .filter((a) => a.outcome === "failed" && a.error)
      .map((a) => row([el("td", label(a)), el("td", "attempt " + a.attempt), el("td", a.error, "msg")]));
    const failed = failures.length ? failures : failedTries;
    replaceRows(box.querySelector("table.failures tbody"), failed.length ? failed : [row(["none"])]);
    const rows = tries.slice(0, MAX_ROWS).map((a) =>
      row([
        el("td", label(a)),
        el("td", a.attempt, "id"),
        el("td", a.worker, "id"),
        el("td", a.host),
        el("td", a.outcome, "outcome-" + String(a.outcome).replace(/[^a-z]/g, "")),
        el("td", a.backup ? "backup" : ""),
        el("td", clock(a.started)),
        el("td", span((num(a.ended) === null ? now : a.ended) - a.started), "num"),
        el("td", a.error, "msg"),
      ]),
    );
    replaceRows(box.querySelector("table.attempts tbody"), rows);
    const more = (num(step.attempts_total) || tries.length) - rows.length;
    box.querySelector("p.more").textContent = more > 0 ? more.toLocaleString() + " more attempts in the chart" : "";
  }
}

function drawTimeline(box, tasks, sets) {
  const holder = box.querySelector(".timeline");
  holder.style.height = Math.min(4000, 90 + 20 * Math.max(1, tasks.length)) + "px";
  let chart = charts.get(box.id);
  if (typeof Chart === "undefined") return;
  if (!chart) {
    chart = new Chart(holder.querySelector("canvas"), {
      type: "bar",
      data: { labels: tasks, datasets: sets },
      options: {
        indexAxis: "y",
        animation: false,
        maintainAspectRatio: false,
        scales: {
          x: { type: "linear", beginAtZero: true, title: { display: true, text: "seconds since the step started" } },
          // Every task named while they fit; past that Chart.js skips labels, not bars.
          y: { stacked: false, ticks: { autoSkip: tasks.length > 150 } },
        },
        plugins: {
          tooltip: {
            callbacks: {
              label: (ctx) => {
                const a = ctx.raw.attempt;
                const took = ctx.raw.x[1] - ctx.raw.x[0];
                const head = a.outcome + (a.backup ? " (backup)" : "") + ": " + a.worker + " on " + a.host + ", " + took.toFixed(1) + " s";
                return a.error ? [head, a.error] : head;
              },
            },
          },
        },
      },
    });
    charts.set(box.id, chart);
    return;
  }
  chart.data.labels = tasks;
  chart.data.datasets = sets;
  chart.options.scales.y.ticks.autoSkip = tasks.length > 150;
  chart.update("none");
}

function jobFromHash() {
  const m = /^#job=(.+)$/.exec(location.hash);
  return m ? decodeURIComponent(m[1]) : null;
}

async function poll() {
  const problems = [];
  const asks = [
    getJson("/api/jobs?offset=" + view.offset + "&limit=" + PAGE).then(drawJobs),
    getJson("/api/workers").then(drawWorkers),
  ];
  const job = view.job;
  if (job) {
    asks.push(
      getJson("/api/jobs/" + encodeURIComponent(job)).then((doc) => {
        if (view.job === job) drawDetail(doc);
      }),
    );
  } else {
    $("detail").hidden = true;
  }
  for (const r of await Promise.allSettled(asks)) {
    if (r.status === "rejected") problems.push(String(r.reason && r.reason.message ? r.reason.message : r.reason));
  }
  $("problem").hidden = problems.length === 0;
  $("problem").textContent = problems.join("\n");
  view.polls += 1;
  document.body.dataset.polls = String(view.polls);
  $("updated").textContent = "updated " + new Date().toLocaleTimeString(undefined, { hour12: false });
}

async function loop() {
  const started = Date.now();
  try {
    await poll();
  } finally {
    setTimeout(loop, Math.max(0, POLL_MS - (Date.now() - started)));
  }
}

function select() {
  view.job = jobFromHash();
  for (const [id, chart] of charts) {
    chart.destroy();
    charts.delete(id);
  }
  $("steps").replaceChildren();
  $("detail").hidden = !view.job;
}

document.addEventListener("DOMContentLoaded", () => {
  $("newer").addEventListener("click", () => {
    view.offset = Math.max(0, view.offset - PAGE);
    poll();
  });
  $("older").addEventListener("click", () => {
    view.offset += PAGE;
    poll();
  });
  $("close").addEventListener("click", (e) => {
    e.preventDefault();
    history.replaceState(null, "", location.pathname);
    select();
  });
  window.addEventListener("hashchange", () => {
    select();
    poll();
  });
  select();
  loop();
});
