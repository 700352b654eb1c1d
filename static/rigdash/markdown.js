/* Markdown for untrusted model output: marked -> DOMPurify, rendered incrementally.
 *
 * Raw HTML in the Markdown is shown as text, never parsed; DOMPurify then removes anything
 * executable that Markdown itself could produce (javascript:/data: links, event handlers), and the
 * page's Content-Security-Policy allows no inline script as a last line of defence.
 *
 * A growing reply is split at the last blank line outside a code fence: blocks before it are
 * rendered once and kept; only the tail is re-rendered, at most once per animation frame.
 *
 * Code blocks are coloured by highlight.js (static/vendor, which builds its spans from the code's text) after
 * sanitising, and get a copy button: a finished block once, the tail's with each render once its fence is closed.
 */
(function () {
  "use strict";

  const escapeHtml = (s) =>
    String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

  marked.use({
    gfm: true,
    breaks: false,
    renderer: {
      html(token) {
        return escapeHtml(typeof token === "string" ? token : token.text);
      },
    },
  });

  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer nofollow");
    }
  });

  const PURIFY = {
    FORBID_TAGS: ["style", "svg", "math", "form", "input", "button", "textarea", "select", "iframe", "object", "embed", "img"],
    FORBID_ATTR: ["style"],
    ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|#)/i,
  };

  function renderMarkdown(text) {
    return DOMPurify.sanitize(marked.parse(text), PURIFY);
  }

  const HIGHLIGHT_MAX_CHARS = 20000; // longer blocks stay plain: colouring them would stall a frame
  if (window.hljs) window.hljs.configure({ ignoreUnescapedHTML: true });

  function codeLanguage(code) {
    const match = /(?:^|\s)language-([\w+#.-]+)/.exec(code.className);
    return match ? match[1] : "";
  }

  /** Give each code block under `root` a copy button, and colour it unless `highlight` is false. */
  function enhance(root, highlight = true) {
    root.querySelectorAll("pre > code").forEach((code) => {
      const pre = code.parentElement;
      if (pre.dataset.enhanced) return;
      pre.dataset.enhanced = "1";
      const lang = codeLanguage(code);
      const hljs = window.hljs;
      if (highlight && hljs && code.textContent.length <= HIGHLIGHT_MAX_CHARS && (!lang || hljs.getLanguage(lang))) {
        try {
          hljs.highlightElement(code);
        } catch (e) {
          /* left plain */
        }
      }
      const tools = document.createElement("div");
      tools.className = "code-tools";
      const label = document.createElement("span");
      label.textContent = lang || code.result?.language || "";
      const copy = document.createElement("button");
      copy.type = "button";
      copy.className = "copy";
      copy.dataset.copy = "code";
      copy.dataset.testid = "copy-code";
      copy.textContent = "Copy";
      copy.setAttribute("aria-label", lang ? `Copy the ${lang} code` : "Copy the code");
      tools.append(label, copy);
      pre.prepend(tools);
    });
  }

  /** Put `text` on the clipboard (the async API where the page may; else a selected textarea). */
  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "visually-hidden";
    document.body.appendChild(area);
    area.select();
    const ok = document.execCommand("copy");
    area.remove();
    return ok ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }

  /** Show "Copied" on `button` for a moment (announced to screen readers through its label). */
  function copyFeedback(button, promise) {
    const before = button.textContent;
    promise.then(
      () => (button.textContent = "Copied"),
      () => (button.textContent = "Copy failed"),
    );
    setTimeout(() => (button.textContent = before), 1500);
  }

  // One listener per page for every code block's button, wherever it is rendered.
  document.addEventListener("click", (event) => {
    const button = event.target.closest ? event.target.closest("button.copy[data-copy=code]") : null;
    if (!button) return;
    const code = button.closest("pre")?.querySelector("code");
    if (code) copyFeedback(button, copyText(code.textContent));
  });

  /** Index just past the last blank line that is not inside a ``` fence (0 if none). */
  function stableEnd(text, from) {
    let end = from;
    let fences = 0;
    const re = /^```|\n\n/gm;
    re.lastIndex = from;
    let m;
    while ((m = re.exec(text)) !== null) {
      if (m[0] === "\n\n") {
        if (fences % 2 === 0) end = m.index + 2;
      } else {
        fences += 1;
      }
    }
    return end;
  }

  class ReplyRenderer {
    constructor(container) {
      this.container = container;
      this.stable = document.createElement("div");
      this.tail = document.createElement("div");
      container.replaceChildren(this.stable, this.tail);
      this.text = "";
      this.stableLen = 0;
      this.frame = 0;
    }

    /** Show `text`; appended text only re-renders the tail. */
    set(text) {
      if (!text.startsWith(this.text.slice(0, this.stableLen))) {
        this.stable.replaceChildren();
        this.stableLen = 0;
      }
      this.text = text;
      if (!this.frame) this.frame = requestAnimationFrame(() => this.flush());
    }

    flush() {
      this.frame = 0;
      // Fences opened in the stable part must be counted from the start; scanning from the
      // previous stable end is safe because a stable end is never inside a fence.
      const end = stableEnd(this.text, this.stableLen);
      if (end > this.stableLen) {
        const block = document.createElement("div");
        block.innerHTML = renderMarkdown(this.text.slice(this.stableLen, end));
        enhance(block);
        this.stable.appendChild(block);
        this.stableLen = end;
      }
      const tail = this.text.slice(this.stableLen);
      this.tail.innerHTML = renderMarkdown(tail);
      // A fence still open is code still arriving: it is coloured once closed, so a long block streaming in costs
      // each frame its Markdown alone.
      enhance(this.tail, (tail.match(/^```/gm) || []).length % 2 === 0);
    }
  }

  window.RigDashMarkdown = { ReplyRenderer, renderMarkdown, enhance, copyText, copyFeedback };
})();
