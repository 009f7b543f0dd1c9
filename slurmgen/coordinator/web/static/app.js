// The coordinator page's own script: live values, the log view and the curves.
// Everything a server or agent names is written with textContent, never as HTML.
"use strict";

(function () {
  const POLL_MS = 1000;

  function keyOf(list) { return list.map(String).join("\u0000"); }

  async function getJSON(url) {
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (response.status === 401) { window.location.assign("/ui/login"); throw new Error("logged out"); }
    if (!response.ok) throw new Error(url + ": HTTP " + response.status);
    return response.json();
  }

  // --- live values: every [data-live] element, refreshed from one JSON snapshot ---------
  // A fresh render of the page (null: not had).
  async function freshPage(region) {
    // The page's own address, not the window's: after a refused POST the window shows the POST's URL.
    const response = await fetch(region.getAttribute("data-page-url"), { credentials: "same-origin" });
    if (!response.ok) return null;
    return new DOMParser().parseFromString(await response.text(), "text/html");
  }

  // Each of these parts of the page replaced by its fresh render's, by id.
  function replaceParts(doc, parts) {
    parts.forEach((part) => {
      const same = doc.getElementById(part.id);
      if (same) part.replaceWith(same);
    });
  }

  async function reloadRegion(region) {
    const picked = new Set(Array.from(region.querySelectorAll("input[type=checkbox]:checked"), (box) => box.value));
    const doc = await freshPage(region);
    const fresh = doc && doc.getElementById("live-region");
    if (!fresh) return region;
    fresh.querySelectorAll("input[type=checkbox]").forEach((box) => { box.checked = picked.has(box.value); });
    region.replaceWith(fresh);
    // The page's other parts that follow the same state (a run page's attempts and time report),
    // kept apart from the region so that what lies between them (a log view, charts) is never redrawn.
    replaceParts(doc, document.querySelectorAll("[data-live-part]"));
    return fresh;
  }

  // A live run's time report, redrawn alone when the poll's period (run_live.REDRAW) is not the
  // one it was rendered in: its goodput and timeline bars follow the run, nothing else is touched.
  async function reloadReport(region, period) {
    const report = document.querySelector("[data-report]");
    if (!period || !report || report.getAttribute("data-report") === period) return;
    const doc = await freshPage(region);
    if (doc) replaceParts(doc, [report]);
  }

  function applyFields(region, fields) {
    const byKey = new Map();
    region.querySelectorAll("[data-live]").forEach((el) => {
      const key = keyOf(JSON.parse(el.getAttribute("data-live")));
      if (!byKey.has(key)) byKey.set(key, []);
      byKey.get(key).push(el);
    });
    for (const [key, text, cls] of fields) {
      for (const el of byKey.get(keyOf(key)) || []) {
        if (el.textContent !== text) el.textContent = text;
        const wanted = el.getAttribute("data-live-kind") === "state" ? "state state-" + cls : (cls || "");
        if (el.className !== wanted) el.className = wanted;
      }
    }
  }

  function startLive() {
    let region = document.getElementById("live-region");
    if (!region) return;
    const url = region.getAttribute("data-live-url");
    async function tick() {
      try {
        const snapshot = await getJSON(url);
        if (snapshot.shape !== region.getAttribute("data-shape")) region = await reloadRegion(region);
        else await reloadReport(region, snapshot.report);
        applyFields(document, snapshot.fields);  // the region's values and its parts' (data-live-part)
        document.body.setAttribute("data-live-at", String(Date.now()));
      } catch (err) { console.warn(err.message); }
      window.setTimeout(tick, POLL_MS);
    }
    window.setTimeout(tick, POLL_MS);
  }

  // --- the log view: the newest lines first, then every line after the last one shown -----
  // One poll loop; a change of the rank filter starts a new generation, and an answer to a
  // request of an older generation (or for another rank) is dropped, never shown.
  // Under a flood the view stays small and current: each answer is at most the server's batch
  // (the newest lines, with how many it left out: a "lines skipped" marker where they were),
  // appended as one fragment, and the view keeps the newest LOG_KEEP lines, the head saying
  // how many earlier ones it let go. Nothing goes silently.
  // A quarter second, with answers of at most 1,000 lines (live.py LOG_BATCH): the same 4,000
  // lines a second at most as half a second and 2,000, but the newest line waits half as long for
  // the next poll and each answer is half the drawing (docs/measurements.md: a group at 10k lines/s).
  const LOG_POLL_MS = 250;
  const LOG_KEEP = 5000;
  const EVERY_LINE = " (every line is in the rank's log on its node)";

  function logRow(line) {
    const row = document.createElement("div");
    row.className = "log-line";
    row.setAttribute("data-rank", String(line.rank));
    const tag = document.createElement("span");
    tag.className = "log-rank";
    tag.textContent = line.rank === null ? "[" + line.worker + "]" : "[rank " + line.rank + "]";
    row.append(tag, " ", line.text);
    return row;
  }

  function marker(cls, text) {
    const row = document.createElement("div");
    row.className = cls;
    row.setAttribute("role", "separator");
    row.textContent = text;
    return row;
  }

  const count = (n) => n.toLocaleString("en-US");

  // The view's rows: a head (the earlier lines let go, and the skipped ones their markers
  // said), then lines and markers, oldest first; and a status beside the controls, in sight
  // whatever the scroll, of how many lines in all are not shown. A view with data-empty says
  // that text (before its head) until a first line arrives, not an empty box.
  function logView(view) {
    const head = marker("log-trimmed", "");
    const empty = document.createElement("p");
    empty.className = "log-empty";
    empty.textContent = view.getAttribute("data-empty") || "";
    const status = document.createElement("span");
    status.className = "log-status";
    view.parentElement.querySelector(".log-controls").append(status);
    let lines = 0, gone = 0, skipped = 0, above = 0, atLeast = false;
    function say() {
      empty.hidden = !empty.textContent || lines + gone + skipped > 0 || atLeast;
      head.hidden = !above;
      head.textContent = "… " + count(above) + " earlier lines not shown: the view keeps the newest " + count(LOG_KEEP) + EVERY_LINE;
      status.textContent = gone + skipped || atLeast ? "newest " + count(lines) + " lines shown, " + (atLeast ? "at least " : "") +
        count(gone + skipped) + " not shown" : "";
    }
    function trim() {
      if (lines <= LOG_KEEP) return;
      let excess = lines - LOG_KEEP, last = head;
      while (excess > 0 && last.nextSibling) {  // walks the rows it removes, reads no layout
        last = last.nextSibling;
        if (last.classList.contains("log-line")) { excess -= 1; lines -= 1; gone += 1; above += 1; }
        else above += Number(last.getAttribute("data-skipped") || 0);
      }
      const range = document.createRange();
      range.setStartAfter(head);
      range.setEndAfter(last);
      range.deleteContents();
    }
    return {
      reset() { lines = gone = skipped = above = 0; atLeast = false; view.replaceChildren(empty, head); say(); },
      append(batch, added, left, uncounted) {
        view.append(batch); lines += added; skipped += left; atLeast = atLeast || uncounted; trim(); say();
      },
    };
  }

  function startLogs() {
    const section = document.querySelector("[data-logs-url]");
    if (!section) return;
    const view = document.getElementById("log-view");
    const rows = logView(view);
    const filter = document.getElementById("rank-filter");
    const taskFilter = document.getElementById("task-filter");  // an array job's: which task's log
    const follow = document.getElementById("follow");
    let after = 0, generation = 0, lastAttempt = null;
    const restart = () => {
      generation += 1; after = 0; lastAttempt = null; rows.reset();
    };
    rows.reset();
    filter.addEventListener("change", restart);
    if (taskFilter) taskFilter.addEventListener("change", restart);
    function show(data) {
      if (!data.lines.length && !data.skipped && !data.at_least) return;
      const atBottom = view.scrollHeight - view.scrollTop - view.clientHeight < 4;
      const batch = document.createDocumentFragment();
      if (data.skipped || data.at_least) {  // at_least: the server had let some go unread, uncounted
        const how = data.at_least ? (data.skipped ? "at least " + count(data.skipped) + " " : "more ") : count(data.skipped) + " ";
        const gap = marker("log-gap", "… " + how + "lines skipped" + EVERY_LINE);
        gap.setAttribute("data-skipped", String(data.skipped));
        batch.append(gap);
      }
      for (const line of data.lines) {
        if (line.attempt !== lastAttempt) {
          batch.append(marker("log-attempt", "── attempt " + line.attempt + " ──"));
          lastAttempt = line.attempt;
        }
        batch.append(logRow(line));
      }
      rows.append(batch, data.lines.length, data.skipped || 0, Boolean(data.at_least));
      if (follow.checked || atBottom) view.scrollTop = view.scrollHeight;
    }
    async function tick() {  // every LOG_POLL_MS from the start of the last, one at a time
      const began = performance.now();
      const mine = generation, wanted = filter.value, task = taskFilter ? taskFilter.value : "";
      try {
        const params = new URLSearchParams({ after: String(after) });
        if (wanted !== "") params.set("rank", wanted);
        if (task !== "") params.set("task", task);
        const data = await getJSON(section.getAttribute("data-logs-url") + "?" + params);
        const forRank = data.rank === null ? "" : String(data.rank);
        const forTask = data.task === null || data.task === undefined ? "" : String(data.task);
        if (mine === generation && forRank === filter.value && (!taskFilter || forTask === taskFilter.value)) {
          show(data);
          after = data.next;
        }
      } catch (err) { console.warn(err.message); }
      window.setTimeout(tick, Math.max(0, LOG_POLL_MS - (performance.now() - began)));
    }
    tick();
  }

  // --- curves: one uPlot chart per metric, by step, one series per run and type ---------
  // Tick labels with as many digits as it takes to tell them apart (a constant lr of 0.001
  // gave three "0.001" ticks).
  function distinctLabels(u, splits) {
    for (let digits = 3; digits <= 12; digits++) {
      const labels = splits.map((v) => (v === null ? "" : String(Number(v.toPrecision(digits)))));
      if (new Set(labels).size === labels.length) return labels;
    }
    return splits.map(String);
  }

  function stepLabels(u, splits) {
    return splits.map((v) => (Number.isInteger(v) ? String(v) : ""));
  }

  // The labels uPlot draws (on its canvas) are also written to the figure, for people using
  // a screen reader and for the tests: data-x-ticks / data-y-ticks.
  function noted(figure, attr, format) {
    return (u, splits) => {
      const labels = format(u, splits);
      figure.setAttribute(attr, labels.filter((l) => l !== "").join(" "));
      return labels;
    };
  }

  // The y axis as wide as its longest label (a fixed 70 px clipped the lr chart's "0.00099999").
  function axisWidth(u, values, axisIdx, cycleNum) {
    const axis = u.axes[axisIdx];
    if (cycleNum > 1) return axis._size;  // uPlot asks again after a resize: settle
    let size = axis.ticks.size + axis.gap + 8;
    const longest = (values || []).reduce((a, v) => (String(v).length > a.length ? String(v) : a), "");
    if (longest) { u.ctx.font = axis.font[0]; size += u.ctx.measureText(longest).width / window.devicePixelRatio; }
    return Math.ceil(size);
  }

  // metric -> kind -> [steps, values], as uPlot's columns: the steps of every kind, a value or null.
  function columnsOf(series) {
    const kinds = Object.keys(series);
    const steps = Array.from(new Set(kinds.flatMap((k) => series[k][0]))).sort((a, b) => a - b);
    return [steps].concat(kinds.map((k) => {
      const [xs, ys] = series[k];
      const at = new Map(xs.map((x, i) => [x, ys[i]]));
      return steps.map((s) => (at.has(s) ? at.get(s) : null));
    }));
  }

  // The chart's text alternative: what a reader of the canvas would take from it.
  function summary(name, series) {
    const parts = Object.keys(series).map((k) => {
      const [xs, ys] = series[k];
      return xs.length ? k + " " + Number(ys[ys.length - 1].toPrecision(4)) + " at step " + xs[xs.length - 1] +
        " (" + xs.length + " points from step " + xs[0] + ")" : k + ": no points";
    });
    return name + " by step: " + parts.join("; ") + ".";
  }

  // One colour per task in every chart of the page (a sweep's task #1 was green in the loss chart
  // and red in the lr one, where the val series did not come first): a sweep's series ("train #1
  // lr=0.002", curves.py) take the colour of their task, its val series dashed; another series that
  // of its name. Given in the order of the names first seen together, then kept while the page lives.
  const PALETTE = ["#2563eb", "#dc2626", "#15803d", "#9333ea", "#c2410c", "#0e7490"];
  const colours = new Map();
  function taskOf(kind) { const m = / (#\d+)(?= |$)/.exec(kind); return m ? m[1] : kind; }
  function learnColours(kinds) {
    const keys = Array.from(new Set(kinds.map(taskOf)));
    keys.sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
    for (const key of keys) if (!colours.has(key)) colours.set(key, PALETTE[colours.size % PALETTE.length]);
  }
  function seriesOf(kind) {
    learnColours([kind]);
    const dashed = taskOf(kind) !== kind && !kind.startsWith("train ");
    return { label: kind, stroke: colours.get(taskOf(kind)), spanGaps: true, dash: dashed ? [6, 4] : undefined };
  }

  // One chart of a metric, built once; `update` appends the new points (uPlot's setData), keeping
  // the user's zoom: a drag narrows the step range, a double click gives it back, and only an
  // unzoomed chart rescales to take in the new points.
  function chart(name, kinds, width) {
    const figure = document.createElement("figure");
    figure.setAttribute("data-metric", name);
    const caption = document.createElement("figcaption");
    caption.textContent = name;
    const text = document.createElement("p");
    text.className = "sr-only chart-summary";
    text.id = "chart-summary-" + name.replace(/[^A-Za-z0-9_-]/g, "_");
    figure.setAttribute("aria-describedby", text.id);
    figure.append(caption, text);
    let zoomed = false;
    const plot = new window.uPlot({
      width, height: 220,
      scales: { x: { time: false } },
      axes: [{ label: "step", values: noted(figure, "data-x-ticks", stepLabels) },
             { values: noted(figure, "data-y-ticks", distinctLabels), size: axisWidth }],
      series: [{ label: "step" }].concat(kinds.map(seriesOf)),
      hooks: { setScale: [(u, key) => {
        const xs = u.data[0];
        if (key === "x" && xs.length) zoomed = u.scales.x.min > xs[0] || u.scales.x.max < xs[xs.length - 1];
      }] },
    }, [[]].concat(kinds.map(() => [])), figure);
    return {
      figure, key: kinds.join("\u0000"),
      update(series) {
        plot.setData(columnsOf(series), !zoomed);
        text.textContent = summary(name, series);
      },
      remove() { plot.destroy(); figure.remove(); },
    };
  }

  function drawCurves(box, data, charts) {
    const names = Object.keys(data.metrics);
    if (typeof window.uPlot === "undefined") return;
    if (!names.length) {  // a new attempt without records: no curves of an older one stay
      const hint = document.createElement("p");
      hint.className = "hint";
      hint.id = "curves-empty";
      hint.textContent = data.why || "No metrics in this attempt's run records yet.";
      charts.forEach((c) => c.remove());
      charts.clear();
      box.replaceChildren(hint);
      return;
    }
    const empty = document.getElementById("curves-empty");
    if (empty) empty.remove();
    let note = box.querySelector(".curves-note");  // e.g. records read on a login node: only their last lines
    if (data.why && !note) { note = document.createElement("p"); note.className = "hint curves-note"; box.prepend(note); }
    if (note) note.textContent = data.why || "";
    const width = Math.max(280, Math.min(box.clientWidth || 600, 720));
    learnColours(names.flatMap((name) => Object.keys(data.metrics[name])));  // before any chart takes one
    for (const [name, c] of charts) if (!(name in data.metrics)) { c.remove(); charts.delete(name); }
    for (const name of names) {
      const kinds = Object.keys(data.metrics[name]);
      let c = charts.get(name);
      if (c && c.key !== kinds.join("\u0000")) { c.remove(); c = undefined; }  // a new series: a new chart
      if (!c) { c = chart(name, kinds, width); charts.set(name, c); }
      box.append(c.figure);  // in the answer's order (a figure already there moves, not rebuilt)
      c.update(data.metrics[name]);
    }
  }

  function startCurves() {
    const box = document.getElementById("curves");
    if (!box) return;
    let seen = "";
    const charts = new Map();
    async function tick() {
      try {
        const data = await getJSON(box.getAttribute("data-metrics-url"));
        const stamp = JSON.stringify([data.metrics, data.why]);
        if (stamp !== seen) { seen = stamp; drawCurves(box, data, charts); }
      } catch (err) { console.warn(err.message); }
      window.setTimeout(tick, 5 * POLL_MS);
    }
    tick();
  }

  // --- the hung ranks' stacks of a live run: asked again until the run ends (run_stacks.py) ---
  function stackFigure(stack) {
    const figure = document.createElement("figure");
    figure.className = "stack";
    const caption = document.createElement("figcaption");
    caption.textContent = (stack.rank === null ? "A hung rank" : "Rank " + stack.rank) +
      (stack.node ? " on " + stack.node : "") + (stack.attempt === null ? "" : ", attempt " + stack.attempt);
    const text = document.createElement("pre");
    text.className = "stack-text";
    text.tabIndex = 0;
    text.textContent = stack.text;
    figure.append(caption, text);
    return figure;
  }

  function startStacks() {
    const section = document.querySelector("[data-stacks-url]");
    if (!section) return;
    const list = document.getElementById("stacks-list");
    let seen = "";
    async function tick() {
      try {
        const data = await getJSON(section.getAttribute("data-stacks-url"));
        const stamp = JSON.stringify(data);
        if (stamp !== seen) {
          const items = data.stacks.map(stackFigure);
          if (data.note) {
            const note = document.createElement("p");
            note.className = "hint";
            note.textContent = data.note;
            items.push(note);
          }
          list.replaceChildren(...items);
          section.hidden = items.length === 0;
        }
        seen = stamp;
      } catch (err) { console.warn(err.message); }
      window.setTimeout(tick, 5 * POLL_MS);
    }
    tick();
  }

  // A form whose control stops ranks on several nodes carries its question (views.stop_question):
  // nothing is posted unless the person says yes. Listened on the document, so a region redrawn
  // by the live poll keeps it. The browser's own dialog shows the question as plain text.
  document.addEventListener("submit", (event) => {
    const question = event.target.dataset && event.target.dataset.confirm;
    if (question && !window.confirm(question)) event.preventDefault();
  });

  document.addEventListener("DOMContentLoaded", () => { startLive(); startLogs(); startCurves(); startStacks(); });
})();
