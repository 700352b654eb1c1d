/* The stored theme ("light" or "dark"), applied before the page paints; none stored: the system's. */
(function () {
  "use strict";
  try {
    const theme = window.localStorage.getItem("rigdash-theme");
    if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
  } catch (e) {
    /* storage refused (privacy mode): follow the system */
  }
})();
