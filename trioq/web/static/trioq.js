// trioq dashboard: the history charts (uPlot), fed from /api/history.
// The rest of the live updating is htmx polling of server-rendered fragments.
"use strict";

(function () {
  const REFRESH_MS = { hour: 5000, day: 60000 };
  const SERIES = {
    throughput: [
      ["completed", "#1d7a46"], ["retried", "#a86400"], ["dead", "#c0362c"],
      ["cancelled", "#667085"],
    ],
    wait: [["wait_p50_ms", "#2f5bd3", "p50"], ["wait_p95_ms", "#7b4fd6", "p95"],
           ["wait_max_ms", "#c0362c", "max"]],
    exec: [["exec_p50_ms", "#2f5bd3", "p50"], ["exec_p95_ms", "#7b4fd6", "p95"],
           ["exec_max_ms", "#c0362c", "max"]],
  };

  function columns(kind, data) {
    return [data.minutes].concat(SERIES[kind].map(([key]) => data[key]));
  }

  function options(kind, width) {
    return {
      width: width, height: 200,
      scales: { x: { time: true } },
      series: [{}].concat(SERIES[kind].map(([key, color, label]) => ({
        label: label || key, stroke: color, width: 1.5, spanGaps: false,
      }))),
      axes: [{}, { size: 60 }],
    };
  }

  function setup(section) {
    const base = section.dataset.history;
    const select = document.getElementById("history-queue");
    const charts = { hour: [], day: [] };
    section.querySelectorAll("[data-chart]").forEach((el) => {
      charts[el.dataset.range].push({ el: el, kind: el.dataset.chart, plot: null });
    });

    async function load(range) {
      const params = new URLSearchParams({ range: range });
      if (select && select.value) params.set("queue", select.value);
      const response = await fetch(base + "?" + params, { credentials: "same-origin" });
      if (!response.ok) return;
      const data = await response.json();
      for (const chart of charts[range]) {
        const cols = columns(chart.kind, data);
        if (chart.plot) {
          chart.plot.setData(cols);
        } else {
          chart.plot = new uPlot(options(chart.kind, chart.el.clientWidth || 560), cols, chart.el);
        }
        chart.el.dataset.loaded = String(data.minutes.length);
      }
      if (range === "hour") {
        for (const name of ["completed", "retried", "dead", "cancelled"]) {
          const el = document.getElementById("total-" + name);
          if (el) el.textContent = data["total_" + name].toLocaleString("en");
        }
      }
    }

    for (const range of ["hour", "day"]) {
      load(range);
      setInterval(() => load(range), REFRESH_MS[range]);
    }
    if (select) select.addEventListener("change", () => { load("hour"); load("day"); });
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("section.charts").forEach(setup);
  });
})();
