"""The decode calculator and decode sweeps (docs/calculator.md): the arithmetic (``model``), hardware presets, the
form, a rig's facts and measured points (``selectors``), the Plotly figures (``plots``), the pages and JSON API
(``views``), a sweep's page and socket data (``sweep_views``)."""
