/* Usage charts: the figures are built in Python (inference/turns/usage.py) and handed over with json_script.
 *
 * The days go on a date axis, so Plotly spaces the labels by the chart's width (a week or a month apart) instead
 * of writing every day's date: readable at 30 days and at 365. */
(function () {
  "use strict";

  const source = document.getElementById("usage-figures");
  const holder = document.querySelector("[data-testid=usage-charts]");
  if (!source || !holder || typeof Plotly === "undefined") return;

  function dateAxis(axis, days, width) {
    return Object.assign({}, axis, {
      type: "date",
      tickformat: days > 120 ? "%b %Y" : "%b %-d",
      hoverformat: "%Y-%m-%d",
      nticks: Math.max(3, Math.min(12, Math.floor(width / 90))),
      ticklabelmode: days > 120 ? "period" : "instant",
      automargin: true,
    });
  }

  JSON.parse(source.textContent).forEach((figure) => {
    const el = document.createElement("div");
    el.className = "chart";
    holder.appendChild(el);
    const days = figure.data.length ? figure.data[0].x.length : 0;
    const layout = Object.assign({}, figure.layout, {
      xaxis: dateAxis(figure.layout.xaxis || {}, days, holder.clientWidth || 600),
      legend: { orientation: "h", x: 0, y: -0.32, yanchor: "top" },
      margin: { t: 40, r: 10, b: 90, l: 60 },
    });
    figure.data.forEach((trace) => (trace.hovertemplate = "%{fullData.name}<br>%{x|%Y-%m-%d}: %{y}<extra></extra>"));
    Plotly.newPlot(el, figure.data, layout, { displaylogo: false, responsive: true });
  });
})();
