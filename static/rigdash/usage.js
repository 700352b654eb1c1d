/* Usage charts: the figures are built in Python (inference/turns/usage.py) and handed over with json_script. */
(function () {
  "use strict";

  const source = document.getElementById("usage-figures");
  const holder = document.querySelector("[data-testid=usage-charts]");
  if (!source || !holder || typeof Plotly === "undefined") return;
  JSON.parse(source.textContent).forEach((figure) => {
    const el = document.createElement("div");
    el.className = "chart";
    holder.appendChild(el);
    Plotly.newPlot(el, figure.data, figure.layout, { displaylogo: false, responsive: true });
  });
})();
