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
  async function reloadRegion(region) {
    const picked = new Set(Array.from(region.querySelectorAll("input[type=checkbox]:checked"), (box) => box.value));
    // The page's own address, not the window's: after a refused POST the window shows the POST's URL.
    const response = await fetch(region.getAttribute("data-page-url"), { credentials: "same-origin" });
    if (!response.ok) return region;
    const doc = new DOMParser().parseFromString(await response.text(), "text/html");
    const fresh = doc.getElementById("live-region");
    if (!fresh) return region;
    fresh.querySelectorAll("input[type=checkbox]").forEach((box) => { box.checked = picked.has(box.value); });
    region.replaceWith(fresh);
    return fresh;
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
        applyFields(region, snapshot.fields);
        document.body.setAttribute("data-live-at", String(Date.now()));
      } catch (err) { console.warn(err.message); }
      window.setTimeout(tick, POLL_MS);
    }
    window.setTimeout(tick, POLL_MS);
  }

  // --- the log view: the newest lines first, then every line after the last one shown -----
  // One poll loop; a change of the rank filter starts a new generation, and an answer to a
  // request of an older generation (or for another rank) is dropped, never shown.
  const LOG_POLL_MS = 500;

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

  function startLogs() {
    const section = document.querySelector("[data-logs-url]");
    if (!section) return;
    const view = document.getElementById("log-view");
    const filter = document.getElementById("rank-filter");
    const taskFilter = document.getElementById("task-filter");  // an array job's: which task's log
    const follow = document.getElementById("follow");
    let after = 0, generation = 0, lastAttempt = null;
    const restart = () => {
      generation += 1; after = 0; lastAttempt = null; view.replaceChildren();
    };
    filter.addEventListener("change", restart);
    if (taskFilter) taskFilter.addEventListener("change", restart);
    function show(data) {
      const atBottom = view.scrollHeight - view.scrollTop - view.clientHeight < 4;
      if (data.gap) view.append(marker("log-gap", "… lines skipped (the rank's full log is on its node)"));
      for (const line of data.lines) {
        if (line.attempt !== lastAttempt) {
          view.append(marker("log-attempt", "── attempt " + line.attempt + " ──"));
          lastAttempt = line.attempt;
        }
        view.append(logRow(line));
      }
      if (data.lines.length && (follow.checked || atBottom)) view.scrollTop = view.scrollHeight;
    }
    async function tick() {
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
      window.setTimeout(tick, LOG_POLL_MS);
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

  function drawCurves(box, data) {
    const names = Object.keys(data.metrics);
    if (typeof window.uPlot === "undefined") return;
    if (!names.length) {  // a new attempt without records: no curves of an older one stay
      const hint = document.createElement("p");
      hint.className = "hint";
      hint.id = "curves-empty";
      hint.textContent = data.why || "No metrics in this attempt's run records yet.";
      box.replaceChildren(hint);
      return;
    }
    box.replaceChildren();
    if (data.why) {  // e.g. records read on a login node: only their last lines
      const note = document.createElement("p");
      note.className = "hint";
      note.textContent = data.why;
      box.append(note);
    }
    const width = Math.max(280, Math.min(box.clientWidth || 600, 720));
    for (const name of names) {
      const kinds = Object.keys(data.metrics[name]);
      const steps = Array.from(new Set(kinds.flatMap((k) => data.metrics[name][k][0]))).sort((a, b) => a - b);
      const columns = kinds.map((k) => {
        const [xs, ys] = data.metrics[name][k];
        const at = new Map(xs.map((x, i) => [x, ys[i]]));
        return steps.map((s) => (at.has(s) ? at.get(s) : null));
      });
      const figure = document.createElement("figure");
      figure.setAttribute("data-metric", name);
      const caption = document.createElement("figcaption");
      caption.textContent = name;
      figure.append(caption);
      box.append(figure);
      const colours = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];
      new window.uPlot({
        width, height: 220,
        scales: { x: { time: false } },
        axes: [{ label: "step", values: noted(figure, "data-x-ticks", stepLabels) },
               { values: noted(figure, "data-y-ticks", distinctLabels), size: 70 }],
        series: [{ label: "step" }].concat(kinds.map((k, i) => ({ label: k, stroke: colours[i % colours.length], spanGaps: true }))),
      }, [steps].concat(columns), figure);
    }
  }

  function startCurves() {
    const box = document.getElementById("curves");
    if (!box) return;
    let seen = "";
    async function tick() {
      try {
        const data = await getJSON(box.getAttribute("data-metrics-url"));
        const stamp = JSON.stringify(data.metrics);
        if (stamp !== seen) { seen = stamp; drawCurves(box, data); }
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

  document.addEventListener("DOMContentLoaded", () => { startLive(); startLogs(); startCurves(); startStacks(); });
})();
