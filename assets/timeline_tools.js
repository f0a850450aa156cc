// The timeline's Perfetto-class tools, on top of assets/timeline.js (which calls decoded, down and overlay):
// - pins: click a track's name to pin it (with the lanes nested under it) to the top; click again to unpin.
// - area selection: the "select area" mode (or Alt+drag) picks a time range across the tracks dragged over; the
//   server sums the ops inside it (app/pages/timeline_tools.py) into the table under the timeline.
// - measure: the "measure" mode; drag (or click twice) to read the time between two points.
// Esc clears the area and the measure.
(function () {
  "use strict";
  var TL = null;                       // window.opscopeTimeline.tools: the mounted timeline's internals
  var S = {mode: "zoom", pins: {}, area: null, measure: null, drag: null, first: null, run: null};
  var AREA = "rgba(234,88,12,0.13)", AREA_EDGE = "#ea580c", MEASURE = "#0f766e", PIN = "#2563eb";

  function api() { TL = TL || (window.opscopeTimeline && window.opscopeTimeline.tools); return TL; }

  function setProps(id, props) {
    if (window.dash_clientside && window.dash_clientside.set_props) window.dash_clientside.set_props(id, props);
  }

  function fmt(ns) { return window.dashAgGridFunctions ? window.dashAgGridFunctions.duration(Math.abs(ns)) : ns + " ns"; }

  // --- pins: a track group (a thread's lane and the "↳" lanes nested under it) moves to the top -----------
  function storeKey(run) { return "opscope.pins." + run; }

  function loadPins(run) {
    if (S.run === run) return;
    S.run = run;
    S.area = S.measure = S.first = null;
    try { S.pins = JSON.parse(sessionStorage.getItem(storeKey(run)) || "{}") || {}; } catch (e) { S.pins = {}; }
  }

  // A track's identity across window answers: its label and how many tracks above it (server order) share it.
  function ids(tracks) {
    var seen = {};
    return tracks.map(function (t) { seen[t] = (seen[t] || 0) + 1; return t + "\u0000" + seen[t]; });
  }

  // The group each track (server order) belongs to: the first track of its run of "↳" lanes.
  function groups(tracks, bands) {
    var g = [];
    tracks.forEach(function (t, k) { g[k] = k > 0 && k >= bands && t.indexOf("\u21b3") === 0 ? g[k - 1] : k; });
    return g;
  }

  // Called by timeline.js with each decoded window answer (server order): reorders it, pinned groups first.
  function decoded(d) {
    if (!api()) return;
    loadPins(d.run || (window.opscopeTimeline.tools.get().view || {}).run);
    d.server = d.tracks.slice();                 // server order, what the area summary asks about
    d.serverIds = ids(d.server);
    d.order = d.server.map(function (_, k) { return k; });   // display row -> server track
    arrange(d);
  }

  function arrange(d) {
    var n = d.server.length, g = groups(d.server, d.bands || 0), pinnedGroups = [], rest = [];
    for (var k = 0; k < n; k++) {
      if (g[k] !== k) continue;
      (S.pins[d.serverIds[k]] ? pinnedGroups : rest).push(k);
    }
    pinnedGroups.sort(function (a, b) { return S.pins[d.serverIds[a]] - S.pins[d.serverIds[b]]; });
    var order = [];
    pinnedGroups.concat(rest).forEach(function (head) {
      for (var k = head; k < n && g[k] === head; k++) order.push(k);
    });
    d.pinned = 0;
    pinnedGroups.forEach(function (head) { for (var k = head; k < n && g[k] === head; k++) d.pinned++; });
    // remap every track index the answer holds from the current display order to the new one
    var now = {}, to = new Int32Array(n);
    d.order.forEach(function (server, row) { now[server] = row; });
    order.forEach(function (server, row) { to[now[server]] = row; });
    function remap(a, count) { for (var i = 0; i < count; i++) if (a[i] >= 0 && a[i] < n) a[i] = to[a[i]]; }
    remap(d.spans.track, d.spans.n);
    remap(d.buckets.track, d.buckets.n);
    remap(d.flows.fromTrack, d.flows.n);
    remap(d.flows.toTrack, d.flows.n);
    d.tracks = order.map(function (k) { return d.server[k]; });
    if (d.clocks) {
      var clocks = d.clocksServer || d.clocks.slice();
      d.clocksServer = clocks;
      d.clocks = order.map(function (k) { return clocks[k]; });
    }
    d.order = order;
  }

  function togglePin(row) {
    var T = TL.get(), d = T.data, server = d.order[row], g = groups(d.server, d.bands || 0), head = g[server];
    var id = d.serverIds[head];
    if (S.pins[id]) delete S.pins[id]; else S.pins[id] = Date.now();
    try { sessionStorage.setItem(storeKey(S.run), JSON.stringify(S.pins)); } catch (e) { /* private mode */ }
    arrange(d);
    T.hover = null;
    T.pickedSpan = null;
    TL.upload();
    TL.draw();
  }

  // --- the mouse ---------------------------------------------------------------------------------------
  function rowAt(y) { return Math.floor((y - TL.TOP) / TL.ROW); }

  function down(e, p) {
    if (!api()) return false;
    var T = TL.get(), d = T && T.data;
    if (!d) return false;
    var row = rowAt(p.y), rows = d.tracks.length;
    if (p.x < 0 && row >= 0 && row < rows && p.y >= TL.TOP) {       // a track's name in the gutter: pin it
      e.preventDefault();
      togglePin(row);
      return true;
    }
    var mode = e.altKey ? "area" : S.mode;
    if (S.passing || mode === "zoom" || p.x < 0 || p.x > T.px) return false;
    e.preventDefault();
    S.drag = {mode: mode, x0: p.x, y0: p.y, x1: p.x, y1: p.y};
    window.addEventListener("mousemove", onDrag);
    window.addEventListener("mouseup", onUp, {once: true});
    return true;
  }

  function onDrag(e) {
    if (!S.drag) return;
    var p = TL.plotX(e), T = TL.get();
    S.drag.x1 = Math.max(0, Math.min(T.px, p.x));
    S.drag.y1 = p.y;
    if (S.drag.mode === "measure") S.measure = {t0: TL.toT(S.drag.x0), t1: TL.toT(S.drag.x1)};
    TL.draw();
  }

  function onUp(e) {
    window.removeEventListener("mousemove", onDrag);
    var g = S.drag, T = TL.get();
    S.drag = null;
    if (!g || !T || !T.data) return;
    var moved = Math.abs(g.x1 - g.x0) > 3;
    if (g.mode === "measure") {
      if (moved) { S.first = null; S.measure = {t0: TL.toT(g.x0), t1: TL.toT(g.x1)}; }
      else if (S.first === null) { S.first = TL.toT(g.x0); S.measure = {t0: S.first, t1: S.first}; }
      else { S.measure = {t0: S.first, t1: TL.toT(g.x0)}; S.first = null; }
      readout();
    } else if (moved) {
      selectArea(TL.toT(Math.min(g.x0, g.x1)), TL.toT(Math.max(g.x0, g.x1)), g.y0, g.y1);
    } else {
      passClick(e);                 // a click, not a drag: it picks the span under it, as in zoom mode
    }
    TL.draw();
  }

  // The timeline's own click (its mousedown and mouseup), at this point: the span's details show.
  function passClick(e) {
    var T = TL.get(), init = {clientX: e.clientX, clientY: e.clientY, button: 0, bubbles: true};
    S.passing = true;
    try {
      T.over.dispatchEvent(new MouseEvent("mousedown", init));
      window.dispatchEvent(new MouseEvent("mouseup", init));
    } finally {
      S.passing = false;
    }
  }

  function selectArea(t0, t1, y0, y1) {
    var T = TL.get(), d = T.data, rows = d.tracks.length;
    var a = Math.max(0, rowAt(Math.min(y0, y1))), z = Math.min(rows - 1, rowAt(Math.max(y0, y1)));
    var tracks = [];
    for (var r = a; r <= z; r++) tracks.push(d.order[r]);
    S.area = {t0: Math.max(0, t0), t1: t1, rows: [a, z], serverTracks: tracks};
    setProps("timeline-area", {data: {run: T.view.run, t0: Math.max(0, Math.floor(t0)), t1: Math.ceil(t1),
                                      tracks: tracks}});
  }

  // --- drawing (on timeline.js's overlay canvas, after everything else) -------------------------------
  function overlay(c) {
    if (!api()) return;
    var T = TL.get(), d = T.data, G = TL.GUTTER, ROW = TL.ROW, TOP = TL.TOP, rows = d.tracks.length;
    c.save();
    if (d.pinned) {                               // the pinned rows: a tint in the gutter, a line under them
      c.fillStyle = "rgba(37,99,235,0.07)";
      c.fillRect(0, TOP, G - 2, d.pinned * ROW);
      c.fillStyle = PIN;
      for (var r = 0; r < d.pinned; r++) {
        if (r === 0 || d.tracks[r].indexOf("\u21b3") !== 0) c.fillRect(0, TOP + r * ROW + 6, 3, ROW - 12);
      }
      c.fillRect(0, TOP + d.pinned * ROW - 1, G + T.px, 2);
    }
    var g = S.drag;
    if (g && g.mode === "area" && Math.abs(g.x1 - g.x0) > 3) {
      var a = Math.max(0, rowAt(Math.min(g.y0, g.y1))), z = Math.min(rows - 1, rowAt(Math.max(g.y0, g.y1)));
      box(c, G + Math.min(g.x0, g.x1), G + Math.max(g.x0, g.x1), a, z);
    } else if (S.area) {
      var x0 = G + Math.max(0, TL.toPx(S.area.t0)), x1 = G + Math.min(T.px, TL.toPx(S.area.t1));
      var rs = S.area.serverTracks.map(function (k) { return d.order.indexOf(k); }).filter(function (k) { return k >= 0; });
      if (x1 > G && x0 < G + T.px && rs.length) box(c, x0, x1, Math.min.apply(null, rs), Math.max.apply(null, rs));
    }
    if (S.measure) measureMark(c, T);
    c.restore();
  }

  function box(c, x0, x1, a, z) {
    var TOP = TL.TOP, ROW = TL.ROW;
    c.fillStyle = AREA;
    c.fillRect(x0, TOP + a * ROW, x1 - x0, (z - a + 1) * ROW);
    c.strokeStyle = AREA_EDGE;
    c.lineWidth = 1.5;
    c.strokeRect(x0 + 0.5, TOP + a * ROW + 0.5, x1 - x0 - 1, (z - a + 1) * ROW - 1);
  }

  function measureMark(c, T) {
    var G = TL.GUTTER, m = S.measure, lo = Math.min(m.t0, m.t1), hi = Math.max(m.t0, m.t1);
    var xa = G + TL.toPx(lo), xb = G + TL.toPx(hi), bottom = T.ph, y = 14;
    c.strokeStyle = MEASURE;
    c.fillStyle = MEASURE;
    c.lineWidth = 1.5;
    c.setLineDash([5, 3]);
    [xa, xb].forEach(function (x) {
      if (x < G || x > G + T.px) return;
      c.beginPath(); c.moveTo(Math.round(x) + 0.5, 0); c.lineTo(Math.round(x) + 0.5, bottom); c.stroke();
    });
    c.setLineDash([]);
    if (hi === lo) return;
    var a = Math.max(G, xa), b = Math.min(G + T.px, xb);
    c.beginPath(); c.moveTo(a, y); c.lineTo(b, y); c.stroke();
    var label = fmt(hi - lo);
    c.font = "600 12px Inter, 'Segoe UI', system-ui, sans-serif";
    var w = c.measureText(label).width + 12, mid = Math.max(G + w / 2, Math.min(G + T.px - w / 2, (a + b) / 2));
    c.fillStyle = "#ffffff";
    c.fillRect(mid - w / 2, y - 9, w, 18);
    c.strokeRect(mid - w / 2 + 0.5, y - 8.5, w - 1, 17);
    c.fillStyle = MEASURE;
    c.textAlign = "center";
    c.textBaseline = "middle";
    c.fillText(label, mid, y);
  }

  // --- the tool bar above the canvas ---------------------------------------------------------------
  var MODES = [["zoom", "zoom", "drag zooms to a range (shift+drag pans)"],
               ["area", "select area", "drag over tracks and time: the ops inside are summed below (or Alt+drag in any mode)"],
               ["measure", "measure", "drag, or click two points: the time between them"]];

  function bar() {
    var host = document.getElementById("timeline-graph");
    if (!host) return;
    var el = document.getElementById("timeline-tools");
    if (!el) {
      el = document.createElement("div");
      el.id = "timeline-tools";
      el.className = "tl-tools";
      host.parentNode.insertBefore(el, host);
      el.addEventListener("click", function (e) {
        var b = e.target.closest && e.target.closest("button[data-mode]");
        if (b) setMode(b.getAttribute("data-mode"));
        if (e.target.closest && e.target.closest("button.tl-clear")) clear();
      });
    }
    var help = MODES.filter(function (m) { return m[0] === S.mode; })[0][2];
    el.innerHTML = "drag: " + MODES.map(function (m) {
      return '<button data-mode="' + m[0] + '" class="' + (S.mode === m[0] ? "on" : "") + '">' + m[1] + "</button>";
    }).join("") + '<span class="tl-tools-help">' + help + " · click a track\u2019s name to pin it to the top · " +
      '<kbd>Esc</kbd> clears</span><span class="tl-measure" id="timeline-measure"></span>' +
      (S.area || S.measure ? ' <button class="tl-clear">clear</button>' : "");
    readout();
  }

  function readout() {
    var el = document.getElementById("timeline-measure");
    if (!el) return;
    var m = S.measure;
    el.textContent = m && m.t1 !== m.t0 ? "measured " + fmt(m.t1 - m.t0) :
      m ? "click a second point" : "";
  }

  function setMode(mode) {
    S.mode = mode;
    S.first = null;
    bar();
    var T = api() && TL.get();
    if (T && T.over) T.over.style.cursor = mode === "zoom" ? "" : mode === "area" ? "cell" : "crosshair";
  }

  function clear() {
    S.area = S.measure = S.first = null;
    setProps("timeline-area", {data: null});
    bar();
    if (api() && TL.get() && TL.get().data) TL.draw();
  }

  document.addEventListener("keydown", function (e) {
    if (e.key === "Escape" && document.getElementById("timeline-graph")) clear();
  });
  // The bar goes with the timeline page: put it back each time Dash draws that page.
  new MutationObserver(function () {
    if (document.getElementById("timeline-graph") && !document.getElementById("timeline-tools")) bar();
  }).observe(document.documentElement, {childList: true, subtree: true});

  window.opscopeTimelineTools = {
    decoded: decoded, down: down, overlay: function (c) { overlay(c); bar2(); }, setMode: setMode, clear: clear,
    // What the tests read: the mode, the pins (display order), the area and the measure.
    state: function () {
      var T = api() && TL.get(), d = T && T.data;
      return {mode: S.mode, pinned: d ? d.pinned || 0 : 0, tracks: d ? d.tracks.slice() : [],
              area: S.area && {t0: S.area.t0, t1: S.area.t1, tracks: S.area.serverTracks.slice()},
              measure: S.measure && Math.abs(S.measure.t1 - S.measure.t0)};
    },
    // The client point of a track's name in the gutter, or of (t ns, row) on the plot: for real clicks.
    gutterPoint: function (row) {
      var T = api() && TL.get(), r = T.over.getBoundingClientRect();
      return {x: r.left + TL.GUTTER - 60, y: r.top + TL.TOP + row * TL.ROW + TL.ROW / 2};
    },
    plotPoint: function (t, row) {
      var T = api() && TL.get(), r = T.over.getBoundingClientRect();
      return {x: r.left + TL.GUTTER + TL.toPx(t), y: r.top + TL.TOP + row * TL.ROW + TL.ROW / 2};
    }
  };

  function bar2() {          // the clear button follows whether there is something to clear
    var el = document.getElementById("timeline-tools");
    var has = !!(S.area || S.measure), shown = !!(el && el.querySelector(".tl-clear"));
    if (el && has !== shown) bar();
  }
})();
