// WASD on the timeline, the way trace viewers (chrome://tracing, Perfetto) do it:
// W/S zoom in/out around the middle, A/D pan by a fifth of the window. The graph's own
// relayout event then asks the server for the new window's level of detail.
(function () {
  var ZOOM = 0.7, PAN = 0.2;
  function graph() {
    var host = document.getElementById("timeline-graph");
    return host ? host.querySelector(".js-plotly-plot") : null;
  }
  document.addEventListener("keydown", function (e) {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    var t = e.target;
    if (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.isContentEditable)) return;
    var key = (e.key || "").toLowerCase();
    if ("wasd".indexOf(key) < 0 || key.length !== 1) return;
    var gd = graph();
    if (!gd || !window.Plotly || !gd.layout || !gd.layout.xaxis || !gd.layout.xaxis.range) return;
    var r = gd.layout.xaxis.range, a = +r[0], b = +r[1], w = b - a, mid = (a + b) / 2;
    if (key === "w") { w *= ZOOM; a = mid - w / 2; b = mid + w / 2; }
    else if (key === "s") { w /= ZOOM; a = mid - w / 2; b = mid + w / 2; }
    else if (key === "a") { a -= w * PAN; b -= w * PAN; }
    else if (key === "d") { a += w * PAN; b += w * PAN; }
    e.preventDefault();
    window.Plotly.relayout(gd, {"xaxis.range[0]": a, "xaxis.range[1]": b});
  });
})();
