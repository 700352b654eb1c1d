/* The rigs overview: one row per rig, updated from every rig's samples. Text only (textContent). */
(function () {
  "use strict";
  const mib = (b) => (b === undefined || b === null ? "–" : `${(b / 2 ** 20).toFixed(1)} MiB`);
  function update(rigId, sample) {
    const row = document.querySelector(`tr[data-rig="${rigId}"]`);
    if (!row) return;
    const s = sample.series || {};
    const backend = (sample.detail.sources || {}).backend || {};
    const agent = sample.detail.agent;
    const agentNote = agent && agent.expected && !agent.up ? ` · ${agent.label}` : "";
    row.querySelector(".state").textContent = (backend.ok ? "up" : `unavailable: ${backend.error || "?"}`) + agentNote;
    row.querySelector(".tps").textContent = s.decode_tps === undefined ? "–" : s.decode_tps.toFixed(1);
    row.querySelector(".slots").textContent = s.total_slots === undefined ? "–" : `${s.busy_slots}/${s.total_slots}`;
    row.querySelector(".kv").textContent = mib(s.kv_used_bytes);
    row.querySelector(".turns").textContent = s.active_turns === undefined ? "–" : String(s.active_turns);
  }
  RigDashSocket.open("/ws/monitoring/", {
    handlers: { "rig.sample": (msg) => update(msg.rig, msg.sample) },
    minRetryMs: 2000,
    maxRetryMs: 2000,
  });
})();
