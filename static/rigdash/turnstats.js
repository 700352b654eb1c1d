/* A turn's stats line (status, the rig that runs it, queue position, TTFT, tokens, tok/s, prompt, context), shared by the chat and
 * compare pages. */
(function () {
  "use strict";

  function fmt(value, digits) {
    return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
  }

  // The backend read clearly less of the prompt than was sent: Ollama dropped the oldest messages to fit its
  // context window, without saying so (stats.history_truncated, set by the worker).
  function truncationText(cut) {
    if (!cut || typeof cut !== "object") return "";
    const read = Number(cut.read);
    const sent = Number(cut.sent_estimate);
    if (!Number.isFinite(read) || !Number.isFinite(sent)) return "";
    const size = Number(cut.window);
    const within = Number.isFinite(size) && size > 0 ? ` to fit its ${size}-token context` : "";
    return `⚠ history cut: the model read ${read} of about ${sent} prompt tokens; older messages were dropped${within}`;
  }

  function statsText(t) {
    const s = t.stats || {};
    const parts = [];
    parts.push(t.status === "decoding" || t.status === "prompt" || t.status === "queued" ? t.status : t.finish_reason || t.status);
    if (t.rig) parts.push(`on ${t.rig}`);
    if (t.status === "queued" && t.queue_position === 0) parts.push("starting");
    if (t.status === "queued" && t.queue_position > 0) {
      const ahead = t.queue_ahead === 1 ? "1 turn waits" : `${t.queue_ahead} turns wait`;
      parts.push(`position ${t.queue_position} in the queue (${ahead} ahead of yours)`);
    }
    if (t.status === "queued" && t.waiting_reason) parts.push(t.waiting_reason);
    if (s.ttft_ms !== undefined) parts.push(`TTFT ${fmt(s.ttft_ms, 0)} ms`);
    const n = s.output_tokens !== undefined ? s.output_tokens : s.tokens;
    if (n !== undefined) parts.push(`${n} tokens`);
    if (s.decode_tps !== undefined) parts.push(`${fmt(s.decode_tps, 1)} tok/s`);
    if (window.RigDashThinking) parts.push(...window.RigDashThinking.statsParts(s));
    if (s.prompt_tokens !== undefined && s.prompt_tokens !== null) parts.push(`prompt ${s.prompt_tokens} tok in ${fmt(s.prompt_ms, 0)} ms`);
    if (s.context_tokens && s.context_limit) parts.push(`context ${s.context_tokens} / ${s.context_limit}`);
    const cut = truncationText(s.history_truncated);
    if (cut) parts.push(cut);
    if (s.energy_j_per_token !== undefined) parts.push(`${fmt(s.energy_j_per_token, 2)} J/tok`);
    const timings = s.backend_timings || {};
    if (timings.draft_n > 0) parts.push(`drafts ${fmt((100 * timings.draft_n_accepted) / timings.draft_n, 0)} % accepted (${timings.draft_n_accepted} / ${timings.draft_n})`);
    return parts.join(" · ");
  }

  window.RigDashStats = { statsText, truncationText };
})();
