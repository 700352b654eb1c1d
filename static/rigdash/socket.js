/* The reconnecting websocket every RigDash page uses: JSON frames dispatched to one handler per type,
 * a connection label ("connecting…", "live", "reconnecting…", "closed"), and retries with backoff.
 * A close code listed in `final` (e.g. 4401 logged out, 4404 no such object) stops retrying and calls
 * `onFinal(code)`: retrying would only be refused again.
 */
(function () {
  "use strict";

  function open(path, options) {
    const { handlers, label = null, onOpen = null, onReconnect = null, final = [], onFinal = null } = options;
    const minRetryMs = options.minRetryMs ?? 500;
    const maxRetryMs = options.maxRetryMs ?? 5000;
    let ws = null;
    let retryMs = minRetryMs;

    function show(text, state) {
      if (!label) return;
      label.textContent = text;
      if (state) label.dataset.state = state;
    }

    function connect() {
      const proto = location.protocol === "https:" ? "wss:" : "ws:";
      ws = new WebSocket(`${proto}//${location.host}${path}`);
      show("connecting…");
      ws.onopen = () => {
        retryMs = minRetryMs;
        show("live", "live");
        if (onOpen) onOpen();
      };
      ws.onmessage = (event) => {
        const msg = JSON.parse(event.data);
        const handler = handlers[msg.type];
        if (handler) handler(msg);
      };
      ws.onclose = (event) => {
        if (final.includes(event.code)) {
          show("closed", "down");
          if (onFinal) onFinal(event.code);
          return;
        }
        show("reconnecting…", "down");
        setTimeout(() => {
          connect();
          if (onReconnect) onReconnect();
        }, retryMs);
        retryMs = Math.min(retryMs * 2, maxRetryMs);
      };
    }

    connect();
    return {
      /** Send a frame; false (and nothing sent) while the socket is not open. */
      send(obj) {
        if (ws && ws.readyState === WebSocket.OPEN) {
          ws.send(JSON.stringify(obj));
          return true;
        }
        return false;
      },
    };
  }

  window.RigDashSocket = { open };
})();
