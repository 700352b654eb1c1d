/* The turn-stream client the chat and compare pages share (docs/streaming.md): a token batch joins its turn's reply
 * when its seq follows what the page holds; a batch already held is dropped; a gap, or a turn the page does not know,
 * asks the server for the turn's snapshot (turn.resync), which the page applies as it arrives. */
(function () {
  "use strict";

  // turns: Map id -> {id, text, seq, stats, resyncing}; resync(id) sends turn.resync. Returns the turn the batch was
  // appended to (the caller redraws it), or null when it was dropped or a snapshot was asked for.
  function accept(turns, msg, resync) {
    const t = turns.get(msg.turn);
    if (!t) {
      resync(msg.turn);
      return null;
    }
    if (t.resyncing || msg.seq_to <= t.seq) return null; // already held
    if (msg.seq_from !== t.seq + 1) {
      t.resyncing = true; // a gap: fetch the reply so far; batches until its snapshot are dropped
      resync(t.id);
      return null;
    }
    t.text += msg.text;
    t.seq = msg.seq_to;
    t.stats = msg.stats;
    return t;
  }

  window.RigDashTurnStream = { accept };
})();
