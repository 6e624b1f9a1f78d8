// pocketmq console: the page behaviours htmx does not cover (the lag chart, the live tail,
// body tabs, check-all). No inline scripts: the pages are served with script-src 'self'.
"use strict";

function lagChart(el) {
  let plot = null;
  const draw = async () => {
    let data;
    try {
      const r = await fetch(el.dataset.src, { headers: { Accept: "application/json" } });
      if (!r.ok) return;
      data = await r.json();
    } catch (e) { return; }
    const cols = [data.x, data.lag];
    el.dataset.points = String(data.x.length);
    if (plot === null) {
      plot = new uPlot({
        width: Math.max(320, el.clientWidth - 16), height: 220,
        scales: { x: { time: true } },
        series: [{}, { label: "lag (messages)", stroke: "#2f6fde", fill: "rgba(47,111,222,0.12)", width: 2, spanGaps: false }],
        axes: [{}, { label: "messages" }],
      }, cols, el);
    } else {
      plot.setData(cols);
    }
  };
  draw();
  setInterval(draw, Math.max(1000, 1000 * Number(el.dataset.interval || 10)));
}

function liveTail(table) {
  const body = table.querySelector("tbody");
  const status = document.getElementById("tail-status");
  const count = document.getElementById("tail-count");
  const pause = document.getElementById("tail-pause");
  const positions = {};       // "broker:queue" -> next offset: where a resume starts
  const MAX_ROWS = 500;       // the page keeps the newest rows only
  let source = null, n = 0;
  const url = () => {
    const q = new URLSearchParams({ topic: table.dataset.topic, expr: table.dataset.expr, type: table.dataset.type });
    const from = Object.entries(positions).map(([k, v]) => k + ":" + v).join(",");
    if (from) q.set("from", from);
    return "/tail/stream?" + q.toString();
  };
  const cell = (tr, text, cls) => { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; tr.appendChild(td); return td; };
  const open = () => {
    source = new EventSource(url());
    source.onerror = () => { status.textContent = "reconnecting…"; };
    source.addEventListener("failure", (ev) => { status.textContent = JSON.parse(ev.data); });
    source.addEventListener("start", (ev) => {
      for (const [k, v] of Object.entries(JSON.parse(ev.data))) if (!(k in positions)) positions[k] = v;
      status.textContent = "live";
    });
    source.addEventListener("msg", (ev) => {
      const m = JSON.parse(ev.data);
      positions[m.broker + ":" + m.queue] = m.offset + 1;
      const tr = document.createElement("tr");
      tr.className = "new";
      tr.dataset.msgId = m.msg_id;
      cell(tr, m.time);
      const a = document.createElement("a");
      a.href = "/messages/view?addr=" + encodeURIComponent(m.store_host) + "&offset=" + m.commit_log_offset;
      a.textContent = m.msg_id;
      cell(tr, "").appendChild(a);
      cell(tr, m.broker + "/" + m.queue + "@" + m.offset);
      cell(tr, m.tags); cell(tr, m.keys); cell(tr, m.body, "body");
      body.insertBefore(tr, body.firstChild);
      while (body.children.length > MAX_ROWS) body.removeChild(body.lastChild);
      count.textContent = String(++n);
    });
  };
  pause.addEventListener("click", () => {
    if (source) { source.close(); source = null; pause.textContent = "Resume"; status.textContent = "paused"; }
    else { open(); pause.textContent = "Pause"; status.textContent = "connecting…"; }
  });
  open();
}

function tabs(bar) {
  bar.querySelectorAll("button[data-tab]").forEach((b) => b.addEventListener("click", () => {
    bar.querySelectorAll("button[data-tab]").forEach((x) => x.classList.toggle("on", x === b));
    document.querySelectorAll("[data-pane]").forEach((p) => { p.hidden = p.dataset.pane !== b.dataset.tab; });
  }));
}

document.addEventListener("DOMContentLoaded", () => {
  const chart = document.getElementById("lag-chart");
  if (chart) lagChart(chart);
  const tail = document.getElementById("tail");
  if (tail) liveTail(tail);
  document.querySelectorAll("[data-tabs]").forEach(tabs);
  document.querySelectorAll("[data-check-all]").forEach((c) => c.addEventListener("change", () => {
    c.closest("table").querySelectorAll("input[name=pick]").forEach((x) => { x.checked = c.checked; });
  }));
});
