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

  // --- the log view: lines after the last sequence number, per rank or all -------------
  function startLogs() {
    const section = document.querySelector("[data-logs-url]");
    if (!section) return;
    const view = document.getElementById("log-view");
    const filter = document.getElementById("rank-filter");
    const follow = document.getElementById("follow");
    let after = 0;
    filter.addEventListener("change", () => { after = 0; view.replaceChildren(); });
    async function tick() {
      try {
        const params = new URLSearchParams({ after: String(after) });
        if (filter.value !== "") params.set("rank", filter.value);
        const data = await getJSON(section.getAttribute("data-logs-url") + "?" + params);
        for (const line of data.lines) {
          const row = document.createElement("div");
          row.className = "log-line" + (line.stream === "stderr" ? " stderr" : "");
          const tag = document.createElement("span");
          tag.className = "log-rank";
          tag.textContent = line.rank === null ? "[" + line.worker + "]" : "[rank " + line.rank + "]";
          row.append(tag, " ", line.text);
          view.append(row);
        }
        after = data.next;
        if (follow.checked && data.lines.length) view.scrollTop = view.scrollHeight;
      } catch (err) { console.warn(err.message); }
      window.setTimeout(tick, POLL_MS);
    }
    tick();
  }

  // --- curves: one uPlot chart per metric, train/val/test as series ----------------------
  function drawCurves(box, data) {
    const names = Object.keys(data.metrics);
    if (!names.length || typeof window.uPlot === "undefined") return;
    box.replaceChildren();
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
      const caption = document.createElement("figcaption");
      caption.textContent = name;
      figure.append(caption);
      box.append(figure);
      const colours = ["#2563eb", "#dc2626", "#16a34a"];
      new window.uPlot({
        width, height: 220,
        series: [{ label: "step" }].concat(kinds.map((k, i) => ({ label: k, stroke: colours[i % 3], spanGaps: true }))),
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

  document.addEventListener("DOMContentLoaded", () => { startLive(); startLogs(); startCurves(); });
})();
