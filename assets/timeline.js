// The timeline page's canvas: spans drawn with WebGL, labels, axis and selection on a 2D canvas on top.
//
// The server sends one window's level of detail at a time (GET /_opscope/timeline, app/pages/timeline.py):
// spans at least a pixel wide as themselves, the rest summed into per-pixel buckets. A zoom or pan
// redraws at once from what the browser holds, then asks for the new window; the answer replaces it.
// Keys and mouse follow the trace viewers users know (chrome://tracing, Perfetto): W/S zoom, A/D pan,
// wheel zooms at the pointer, drag zooms to a range, shift+drag pans, double-click shows the whole run.
(function () {
  "use strict";
  var ROW = 28, PAD = 4, TOP = 4, GUTTER = 190, RIGHT = 12, AXIS = 34, CROW = 40;   // CROW: a counter track
  var ZOOM = 0.7, PAN = 0.2, FETCH_DELAY_MS = 40, LABEL_MIN_PX = 44;
  var LIVE_MS = 200;        // a running run: the pause before asking again after an answer with no new spans
  var LIVE_WAIT_S = 2;      // how long the server may hold an ask for new spans (app/pages/timeline.py's wait=)
  var LIVE_REDRAW = 100000;  // spans appended since the last window answer past which a live page asks for a new one
  var INK = "#1f2933", MUTED = "#6b7785", GRID = "#e6e9ee", SEL = "rgba(37,99,235,0.15)";
  var BUCKET_LIGHT = [213, 219, 225], BUCKET_DARK = [107, 119, 133], HIT = [225, 29, 72], MARK = "rgba(225,29,72,0.18)";
  var HOST = "timeline-graph", INFO = "timeline-info", PICKED = "timeline-picked", FIND = "timeline-find";
  var T = null;           // the mounted timeline; null on other pages
  var STEP_KEY = -3;      // key0 of a span on the step track (app/web/timeline.py)
  var ANNOTATION_KEY = -5;   // key0 of an imported annotation or runtime call (app/web/timeline.py)
  var PHASE_KEY = -4;     // key0 of a span on a training run's phase band (key1: step * 8 + phase)

  function prefix() {
    try { return JSON.parse(document.getElementById("_dash-config").textContent).requests_pathname_prefix || "/"; }
    catch (e) { return "/"; }
  }

  // --- data --------------------------------------------------------------------------------
  function typed(b64, Type) {
    var s = atob(b64), u = new Uint8Array(s.length);
    for (var i = 0; i < s.length; i++) u[i] = s.charCodeAt(i);
    return new Type(u.buffer);
  }

  function decode(p) {
    var s = p.spans, b = p.buckets;
    p.spans = {n: s.n, start: typed(s.start, Float64Array), end: typed(s.end, Float64Array),
               track: typed(s.track, Int32Array), label: typed(s.label, Int32Array),
               key0: typed(s.key0, Float64Array), key1: typed(s.key1, Float64Array)};
    p.buckets = {n: b.n, start: typed(b.start, Float64Array), end: typed(b.end, Float64Array),
                 track: typed(b.track, Int32Array), count: typed(b.count, Float64Array),
                 busy: typed(b.busy, Float64Array), hits: typed(b.hits, Float64Array)};
    var f = p.flows || {n: 0, from: "", from_track: "", to: "", to_track: ""};
    p.flows = {n: f.n, from: typed(f.from, Float64Array), fromTrack: typed(f.from_track, Int32Array),
               to: typed(f.to, Float64Array), toTrack: typed(f.to_track, Int32Array)};
    p.rgb = p.colors.map(hex);
    p.counters = (p.counters || []).map(function (c) {      // memory and hardware samples, on the same axis
      return {name: c.name, unit: c.unit, max: c.max, n: c.n, t: typed(c.t, Float64Array), v: typed(c.v, Float64Array)};
    });
    p.hit = {};                                   // label codes matching the search, when there is one
    (p.matched || []).forEach(function (k) { p.hit[k] = true; });
    return p;
  }

  function hex(c) { return [parseInt(c.slice(1, 3), 16), parseInt(c.slice(3, 5), 16), parseInt(c.slice(5, 7), 16)]; }

  function query(view, t0, t1) {
    var q = "run=" + encodeURIComponent(view.run) + "&px=" + Math.round(T.px);
    if (view.find) q += "&find=" + encodeURIComponent(view.find);
    if (t0 !== undefined) q += "&t0=" + Math.floor(t0) + "&t1=" + Math.ceil(t1);
    else if (view.step !== undefined && view.step !== null && view.step !== "all") q += "&step=" + view.step;
    return q;
  }

  function estimatePx() { return Math.max(200, Math.min(window.innerWidth, 1680) - 40 - 34 - GUTTER - RIGHT); }

  function load(q) {
    if (T.inflight) T.inflight.abort();
    var ctl = new AbortController();
    T.inflight = ctl;
    T.fetches++;
    return fetch(prefix() + "_opscope/timeline?" + q, {signal: ctl.signal, credentials: "same-origin"})
      .then(window.opscopeJson)     // app/web/server.py's <head> script: JSON, or the server's one line as the error
      .then(function (p) {
        if (T && T.inflight === ctl) {
          T.inflight = null;
          if (T.grow) setTimeout(grown, 0);      // after the caller has drawn this answer
        }
        return p;
      });
  }

  // A live run's newer stamp while a fetch is in flight: that fetch is let finish and drawn, then one more asks
  // for what arrived meanwhile. Aborting it for each new stamp (every poll, while a busy server took longer than
  // a poll to answer) drew nothing new until the run ended: the timeline ran seconds behind the header.
  function grown() {
    if (!T || T.inflight || !T.grow || !T.view) return;
    T.grow = false;
    if (T.data) refetch(T.t0 <= 0 && T.t1 >= T.end); else reset(T.view);
  }

  // --- the page follows the VIEW store: {run, stamp, step, find} ---------------------------------
  function follow(view) {
    var host = document.getElementById(HOST);
    if (!view || !host) { T = null; return; }
    if (!T || T.host !== host || !host.contains(T.wrap)) mount(host);
    var prev = T.view;
    T.view = view;
    if (prev && prev.run === view.run && String(prev.step) === String(view.step)) {
      if (prev.stamp === view.stamp && prev.find === view.find) return;
      // a running run's new events are appended by live() as they are stored: a new stamp asks for nothing more
      if (prev.find === view.find && T.data && T.data.status === "running" && statusOf(view) === "running") return;
      // a running run's window in flight: live() appends from its last span on, so more events ask for nothing
      if (T.inflight && prev.find === view.find && statusOf(prev) === "running" && statusOf(view) === "running") return;
      if (T.inflight && prev.find === view.find) { T.grow = true; return; }   // more events: see grown()
      if (T.mark && T.mark.find !== view.find) T.mark = null;   // (Enter may have marked the new text's first match)
      // More events or a new status: the same window redrawn; a view of the whole run grows with the run.
      if (T.data) return refetch(T.t0 <= 0 && T.t1 >= T.end);
    }
    reset(view);                           // a new run or step, or a run whose first spans just arrived
  }

  function statusOf(view) { var s = String(view.stamp || ""); return s.slice(s.lastIndexOf(":") + 1); }

  // --- a live run: the spans stored since the page's last ones, appended (GET /_opscope/live_spans) -----------
  // Asking only for what changed keeps the timeline as fresh as the header: a whole window rebuilt for each new
  // stamp (the server's level of detail over every span, then the browser's upload) fell seconds behind it.
  // The server holds each ask until a span past the page's last one has arrived (wait=, a long poll): the page
  // asks again as soon as it has drawn an answer, so a batch is drawn when it arrives, not a poll interval
  // later; after an empty answer (nothing came within the wait) it pauses LIVE_MS.
  function live(delay) {
    if (!T || T.liveTimer || !T.data || T.data.status !== "running") return;
    T.liveTimer = setTimeout(function () {
      T.liveTimer = null;
      var d = T.data;
      if (!d || d.status !== "running" || !T.view || T.view.run !== d.run) return;
      var q = "run=" + encodeURIComponent(d.run) + "&since=" + d.events + "&origin=" + d.origin +
        "&wait=" + LIVE_WAIT_S;
      fetch(prefix() + "_opscope/live_spans?" + q, {credentials: "same-origin"}).then(window.opscopeJson)
        .then(function (p) {
          if (!T || T.data !== d) return;             // a window answer replaced what this would append to
          if (p.status !== "running" || !append(d, p)) { d.status = p.status; refetch(T.t0 <= 0 && T.t1 >= T.end); }
          live(p.start && p.start.length ? 0 : LIVE_MS);
        }).catch(function () { setTimeout(live, 1000); });    // a poll lost (a busy server): the next one asks again
    }, delay === undefined ? LIVE_MS : delay);
  }

  // A running run with no spans stored yet: the page waits on the live answer for its first ones (they are in the
  // collector's memory before the store) and then asks for its window, instead of waiting for the header's next
  // poll to say that events arrived. Until the store has them too, the window says "not yet" and this asks again.
  function first(run) {
    if (!T || T.firstTimer) return;
    var token = T.seq;
    T.firstTimer = setTimeout(function () {
      T.firstTimer = null;
      if (!T || T.seq !== token || T.data || !T.view || T.view.run !== run) return;
      var q = "run=" + encodeURIComponent(run) + "&since=0&wait=" + LIVE_WAIT_S;
      fetch(prefix() + "_opscope/live_spans?" + q, {credentials: "same-origin"}).then(window.opscopeJson)
        .then(function (p) {
          if (!T || T.seq !== token || T.data) return;
          if ((p.start && p.start.length) || p.status !== "running") reset(T.view); else first(run);
        }).catch(function () {});       // the header's poll still brings the window when events are stored
    }, LIVE_MS);
  }

  // Appends a live answer's spans to what the page draws; false when they need a new window instead (a new op
  // name or track: the legend and the lanes come with a window answer, or too many appended).
  function append(d, p) {
    var n = p.start.length, s = d.spans;
    if (!n) return true;
    if (d.appended + n > LIVE_REDRAW) return false;
    var tracks = {}, names = {}, i;
    d.tracks.forEach(function (t, k) { tracks[t] = k; });
    for (i = 0; i < d.frames_from; i++) names[d.names[i]] = i;
    var tr = new Int32Array(n), lb = new Int32Array(n);
    for (i = 0; i < n; i++) {
      tr[i] = tracks[p.track[i]] === undefined ? -1 : tracks[p.track[i]];
      lb[i] = names[p.name[i]] === undefined ? -1 : names[p.name[i]];
      if (tr[i] < 0 || lb[i] < 0) return false;
    }
    function grow(a, add) { var out = new a.constructor(s.n + n); out.set(a.subarray(0, s.n)); out.set(add, s.n); return out; }
    var whole = T.t0 <= 0 && T.t1 >= T.end, end = T.end;
    for (i = 0; i < n; i++) end = Math.max(end, p.end[i]);
    d.spans = {n: s.n + n, start: grow(s.start, p.start), end: grow(s.end, p.end), track: grow(s.track, tr),
               label: grow(s.label, lb), key0: grow(s.key0, p.step), key1: grow(s.key1, p.seq)};
    d.events += n;
    d.count += n;
    d.appended += n;
    if (whole && end > T.end) {         // a view of the whole run grows with the run
      T.t1 = end + Math.max(1, end / 100);
      T.shown = [T.t0, T.t1];
    }
    T.end = d.end = end;
    upload(n);
    draw();
    info("all of " + d.count.toLocaleString("en-US") + " spans so far · " + d.appended.toLocaleString("en-US") +
         " appended live");
    return true;
  }

  function reset(view) {
    var token = ++T.seq;
    T.grow = false;
    T.data = null;
    var first = window.opscopeTimelineFirst;     // started from <head> (app/web/server.py) while scripts loaded
    window.opscopeTimelineFirst = null;
    var got = first && first.step === String(view.step) && (!first.run || first.run === view.run)
      ? first.promise : load(query(view));
    got.then(function (p) {
      if (!T || T.seq !== token) return;
      if (p.run && p.run !== view.run) {          // the head's guess (no ?run=) named another run
        load(query(view)).then(function (q) { if (T && T.seq === token) show(q, true); }).catch(failed);
        return;
      }
      show(p, true);
      var stale = p.stamp !== T.view.stamp && !(T.data && T.data.status === "running" && statusOf(T.view) === "running");
      if (T.data && (stale || Math.abs(T.px - (first ? first.px : T.px)) > 0.1 * T.px)) {   // (a running one: live())
        refetch(T.t0 <= 0 && T.t1 >= T.end);
      }
    }).catch(failed);
  }

  function refetch(whole) {
    if (!T || !T.view) return;
    var v = T.view, token = T.seq;
    load(whole ? query(v) : query(v, T.t0, T.t1))
      .then(function (p) { if (T && T.seq === token) show(p, !!whole); }).catch(failed);
  }

  function failed(e) {
    if (e && e.name === "AbortError") return;
    if (T) T.inflight = null;
    note("Could not load the timeline: " + (e && e.message ? e.message : e));
  }

  function show(p, reset) {
    if (p.error || p.message) {
      note(p.error || p.message);
      info("");
      if (!p.error && p.status === "running") first(p.run);
      return;
    }
    if (!T.wrap.contains(T.canvas)) mountCanvases();
    T.data = decode(p);
    if (window.opscopeTimelineTools) window.opscopeTimelineTools.decoded(T.data);   // pinned tracks on top
    T.end = p.end;
    if (reset) { T.t0 = p.t0; T.t1 = p.t1; }
    upload();
    legend();
    inView();
    resize();
    draw();
    info(p.info);
    T.shown = [p.t0, p.t1];
    T.data.appended = 0;
    live();
    if (!T.announced) {
      T.announced = true;
      document.dispatchEvent(new Event("opscope:timeline-drawn"));
    }
  }

  function info(text) {
    if (window.dash_clientside && window.dash_clientside.set_props) window.dash_clientside.set_props(INFO, {children: text});
  }

  function note(text) {
    T.wrap.innerHTML = "";
    var n = document.createElement("div");
    n.className = "note";
    n.textContent = text;
    T.wrap.appendChild(n);
    T.data = null;
  }

  // --- DOM ---------------------------------------------------------------------------------
  function mount(host) {
    var wrap = document.createElement("div");
    wrap.className = "tl-wrap";
    host.innerHTML = "";
    host.appendChild(wrap);
    T = {host: host, wrap: wrap, view: null, data: null, t0: 0, t1: 1, end: 1, px: estimatePx(), fetches: 0,
         draws: 0, seq: 0, shown: null, hover: null, drag: null, mouse: null, inflight: null, timer: null,
         announced: false, legendKey: ""};
    T.canvas = document.createElement("canvas");
    T.canvas.className = "tl-gl";
    T.over = document.createElement("canvas");
    T.over.className = "tl-over";
    T.under = document.createElement("canvas");      // the grid, under the spans
    T.under.className = "tl-under";
    T.tip = document.createElement("div");
    T.tip.className = "tl-tip";
    T.legend = document.createElement("div");
    T.legend.className = "tl-legend";
    T.summary = document.createElement("div");
    T.summary.className = "tl-summary";
    T.summary.addEventListener("click", function (e) {      // a row searches for its op
      var row = e.target.closest && e.target.closest("tr[data-name]");
      if (row && window.dash_clientside && window.dash_clientside.set_props) {
        window.dash_clientside.set_props(FIND, {value: row.getAttribute("data-name")});
      }
    });
    mountCanvases();
    T.gl = T.canvas.getContext("webgl", {antialias: false, alpha: true, preserveDrawingBuffer: true});
    if (T.gl) setupGl(T.gl); else T.ctx = T.canvas.getContext("2d");   // no WebGL: the same rects, 2D
    T.over.addEventListener("wheel", onWheel, {passive: false});
    T.over.addEventListener("mousedown", onDown);
    T.over.addEventListener("mousemove", onHover);
    T.over.addEventListener("mouseleave", function () { T.mouse = null; T.hover = null; T.tip.style.display = "none"; draw(); });
    T.over.addEventListener("dblclick", function () { setView(0, T.end + Math.max(1, T.end / 100)); });
  }

  function mountCanvases() {
    T.wrap.innerHTML = "";
    T.wrap.appendChild(T.legend);
    var stage = document.createElement("div");
    stage.className = "tl-stage";
    stage.appendChild(T.under);
    stage.appendChild(T.canvas);
    stage.appendChild(T.over);
    stage.appendChild(T.tip);
    T.wrap.appendChild(stage);
    T.stage = stage;
    T.wrap.appendChild(T.summary);
  }

  function resize() {
    var w = Math.max(300, T.stage.clientWidth || T.host.clientWidth || 1200);
    var rows = T.data ? T.data.tracks.length : 1;
    T.px = Math.max(100, w - GUTTER - RIGHT);
    T.ph = TOP + rows * ROW + 2;                         // the plot's height
    T.ch = T.data ? T.data.counters.length * CROW : 0;   // the counter tracks' height, under the plot
    var dpr = window.devicePixelRatio || 1, h = T.ph + T.ch + AXIS;
    T.stage.style.height = h + "px";
    T.canvas.style.left = GUTTER + "px";
    T.canvas.style.width = T.px + "px";
    T.canvas.style.height = T.ph + "px";
    T.canvas.width = Math.round(T.px * dpr);
    T.canvas.height = Math.round(T.ph * dpr);
    [T.over, T.under].forEach(function (c) {
      c.style.width = w + "px";
      c.style.height = h + "px";
      c.width = Math.round(w * dpr);
      c.height = Math.round(h * dpr);
    });
    T.dpr = dpr;
    T.w = w;
  }

  function legend() {
    var d = T.data, seen = {}, items = [];
    for (var i = 0; i < d.spans.n; i++) seen[d.spans.label[i]] = true;
    Object.keys(seen).map(Number).sort(function (a, b) { return d.groups[a] < d.groups[b] ? -1 : 1; })
      .forEach(function (k) { items.push([d.colors[k], d.legend ? d.legend[k] : d.groups[k]]); });   // a kernel: its name
    if (d.buckets.n) items.push(["#9aa5b1", "too small to draw: zoom in"]);
    if (d.find && Array.prototype.some.call(d.buckets.hits, function (h) { return h > 0; })) {
      items.push(["rgb(" + HIT.join(",") + ")", "holds a match for \u201c" + d.find + "\u201d"]);
    }
    var seenName = {}, key;
    items = items.filter(function (it) { if (seenName[it[1]]) return false; seenName[it[1]] = 1; return true; });
    key = items.map(function (it) { return it[1]; }).join("|");
    if (key === T.legendKey) return;
    T.legendKey = key;
    T.legend.innerHTML = "";
    items.forEach(function (it) {
      var s = document.createElement("span"), sw = document.createElement("i");
      s.className = "tl-key";
      sw.style.background = it[0];
      s.appendChild(sw);
      s.appendChild(document.createTextNode(it[1]));
      T.legend.appendChild(s);
    });
  }

  // What the window holds, by op: calls and time inside it (server-side, over every span, not only the
  // drawn ones), so a zoom answers "what is this stretch made of" without leaving the timeline.
  function inView() {
    var d = T.data, top = d.top;
    if (!top || !top.label.length) { T.summary.innerHTML = ""; return; }
    var rows = top.label.map(function (k, i) {
      return '<tr data-name="' + esc(d.names[k]) + '" title="search for it"><td><i style="background:' + d.colors[k] +
        '"></i>' + esc(d.names[k]) + '</td><td>' + top.count[i].toLocaleString() + '</td><td>' + fmtDur(top.total[i]) +
        '</td><td>' + (100 * top.total[i] / Math.max(1, (top.window || top.busy) * ((top.lanes || [])[i] || 1))).toFixed(1) +
        ' %</td></tr>';
    });
    T.summary.innerHTML = '<div class="tl-sum-head">In this window, by time (nested ops count in their parents too; ' +
      'share: of the window\u2019s length, per lane the op runs on)</div>' +
      '<table><thead><tr><th>op</th><th>calls</th><th>time</th><th>of window</th></tr></thead><tbody>' + rows.join("") +
      '</tbody></table>';
  }

  // --- WebGL -------------------------------------------------------------------------------
  // A rect is two triangles; each vertex carries the span's [start, end] (ns since the data's first
  // window start, float32) so zoom and pan only change two uniforms. Spans narrower than a pixel
  // (after a client-side zoom out) are widened to one pixel in the shader rather than vanish.
  var VS = "attribute vec2 a_span; attribute vec2 a_corner; attribute vec4 a_color;" +
           "uniform vec2 u_x; uniform float u_h; uniform float u_px; varying vec4 v_color;" +
           "void main() { float l = a_span.x * u_x.x + u_x.y, r = a_span.y * u_x.x + u_x.y;" +
           " float c = 0.5 * (l + r), hw = max(0.5 * (r - l), u_px);" +
           " gl_Position = vec4(a_corner.x < 0.5 ? c - hw : c + hw, 1.0 - 2.0 * a_corner.y / u_h, 0.0, 1.0);" +
           " v_color = a_color; }";
  var FS = "precision mediump float; varying vec4 v_color; void main() { gl_FragColor = v_color; }";

  function setupGl(gl) {
    function shader(type, src) {
      var s = gl.createShader(type);
      gl.shaderSource(s, src);
      gl.compileShader(s);
      return s;
    }
    var p = gl.createProgram();
    gl.attachShader(p, shader(gl.VERTEX_SHADER, VS));
    gl.attachShader(p, shader(gl.FRAGMENT_SHADER, FS));
    gl.linkProgram(p);
    T.prog = p;
    T.buf = gl.createBuffer();
    T.loc = {span: gl.getAttribLocation(p, "a_span"), corner: gl.getAttribLocation(p, "a_corner"),
             color: gl.getAttribLocation(p, "a_color"), x: gl.getUniformLocation(p, "u_x"),
             h: gl.getUniformLocation(p, "u_h"), px: gl.getUniformLocation(p, "u_px")};
  }

  var STRIDE = 20;           // bytes a vertex: span (2 f32), corner (2 f32), color (4 u8)
  var CORNERS = [0, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1];   // (right?, bottom?) for the six vertices

  // The rectangles' vertices, buckets first, then spans. `appended` (a live run's new spans, the last ones): only
  // theirs are written and sent to the GPU, into a buffer grown by doubling, so an append costs what it adds, not
  // the whole run again.
  function upload(appended) {
    var d = T.data, s = d.spans, b = d.buckets, n = s.n + b.n, first = appended ? n - appended : 0;
    if (!appended) T.base = d.t0;
    T.nverts = 6 * n;
    if (!T.gl) return;
    var grow = !appended || !T.vbuf || T.vbuf.byteLength < T.nverts * STRIDE;
    if (grow) {
      var old = T.vbuf;
      T.vbuf = new ArrayBuffer((appended ? 2 : 1) * T.nverts * STRIDE);
      if (appended) new Uint8Array(T.vbuf).set(new Uint8Array(old, 0, 6 * first * STRIDE));
    }
    var buf = T.vbuf, f = new Float32Array(buf), u = new Uint8Array(buf);
    var v = 6 * first;
    function rect(x0, x1, track, rgb) {
      var top = TOP + track * ROW + PAD, bottom = top + ROW - 2 * PAD;
      for (var j = 0; j < 6; j++, v++) {
        var o = v * 5;
        f[o] = x0 - T.base; f[o + 1] = x1 - T.base;
        f[o + 2] = CORNERS[2 * j]; f[o + 3] = CORNERS[2 * j + 1] ? bottom : top;
        u[o * 4 + 16] = rgb[0]; u[o * 4 + 17] = rgb[1]; u[o * 4 + 18] = rgb[2]; u[o * 4 + 19] = 255;
      }
    }
    for (var i = first; i < b.n; i++) rect(b.start[i], b.end[i], b.track[i], bucketRgb(d, i));
    for (i = Math.max(first - b.n, 0); i < s.n; i++) rect(s.start[i], s.end[i], s.track[i], spanRgb(d, i));
    var gl = T.gl;
    gl.bindBuffer(gl.ARRAY_BUFFER, T.buf);
    if (grow) gl.bufferData(gl.ARRAY_BUFFER, buf, gl.DYNAMIC_DRAW);
    else gl.bufferSubData(gl.ARRAY_BUFFER, 6 * first * STRIDE, new Uint8Array(buf, 6 * first * STRIDE,
                                                                               6 * appended * STRIDE));
    T.uploaded = (T.uploaded || 0) + n - first;      // rectangles written since the page opened (state())
  }

  // How busy a pixel bucket is sets its shade: a run of back-to-back tiny ops reads darker than a sparse one.
  // With a search, a bucket holding a match is drawn in the match color, and everything else fades.
  function bucketRgb(d, i) {
    var b = d.buckets;
    if (d.find && b.hits[i] > 0) return HIT;
    var f = Math.min(1, b.busy[i] / Math.max(1, b.end[i] - b.start[i]));
    f = 0.25 + 0.75 * f;
    var rgb = [0, 1, 2].map(function (c) { return Math.round(BUCKET_LIGHT[c] + (BUCKET_DARK[c] - BUCKET_LIGHT[c]) * f); });
    return d.find ? faded(rgb) : rgb;
  }

  function spanRgb(d, i) {
    var k = d.spans.label[i];
    return d.find && !d.hit[k] ? faded(d.rgb[k]) : d.rgb[k];
  }

  function faded(rgb) { return rgb.map(function (c) { return Math.round(0.25 * c + 0.75 * 255); }); }

  // --- drawing -----------------------------------------------------------------------------
  function draw() {
    if (!T || !T.data || T.pending) return;
    T.pending = true;
    requestAnimationFrame(function () { T && (T.pending = false, paint()); });
  }

  function paint() {
    if (!T.data) return;
    T.draws++;
    var span = T.t1 - T.t0;
    if (T.gl) {
      var gl = T.gl, L = T.loc;
      gl.viewport(0, 0, T.canvas.width, T.canvas.height);
      gl.clearColor(0, 0, 0, 0);
      gl.clear(gl.COLOR_BUFFER_BIT);
      gl.useProgram(T.prog);
      gl.bindBuffer(gl.ARRAY_BUFFER, T.buf);
      gl.enableVertexAttribArray(L.span);
      gl.vertexAttribPointer(L.span, 2, gl.FLOAT, false, STRIDE, 0);
      gl.enableVertexAttribArray(L.corner);
      gl.vertexAttribPointer(L.corner, 2, gl.FLOAT, false, STRIDE, 8);
      gl.enableVertexAttribArray(L.color);
      gl.vertexAttribPointer(L.color, 4, gl.UNSIGNED_BYTE, true, STRIDE, 16);
      // clip x = 2 * (base + x - t0) / span - 1
      gl.uniform2f(L.x, 2 / span, 2 * (T.base - T.t0) / span - 1);
      gl.uniform1f(L.h, T.ph);
      gl.uniform1f(L.px, 1 / T.px);
      gl.drawArrays(gl.TRIANGLES, 0, T.nverts);
    } else {
      paint2d();
    }
    overlay();
  }

  function paint2d() {
    var c = T.ctx, d = T.data, s = d.spans, b = d.buckets;
    c.setTransform(T.dpr, 0, 0, T.dpr, 0, 0);
    c.clearRect(0, 0, T.px, T.ph);
    function rect(x0, x1, track, rgb) {
      var a = toPx(x0), z = Math.max(toPx(x1), a + 1);
      c.fillStyle = "rgb(" + rgb.join(",") + ")";
      c.fillRect(a, TOP + track * ROW + PAD, z - a, ROW - 2 * PAD);
    }
    for (var i = 0; i < b.n; i++) rect(b.start[i], b.end[i], b.track[i], bucketRgb(d, i));
    for (i = 0; i < s.n; i++) rect(s.start[i], s.end[i], s.track[i], spanRgb(d, i));
  }

  function toPx(t) { return (t - T.t0) / (T.t1 - T.t0) * T.px; }
  function toT(x) { return T.t0 + x / T.px * (T.t1 - T.t0); }

  function overlay() {
    var c = T.over.getContext("2d"), g = T.under.getContext("2d"), d = T.data, rows = d.tracks.length;
    var bottom = T.ph + T.ch;                    // the axis sits under the counter tracks
    [c, g].forEach(function (x) { x.setTransform(T.dpr, 0, 0, T.dpr, 0, 0); x.clearRect(0, 0, T.w, bottom + AXIS); });
    c.font = "12px Inter, 'Segoe UI', system-ui, sans-serif";
    c.textBaseline = "middle";
    // tracks, each with the clock its times come from
    T.labels = [];
    for (var k = 0; k < rows; k++) {
      var y = TOP + k * ROW, clock = d.clocks && d.clocks[k];
      if (k) { g.fillStyle = "#eef1f4"; g.fillRect(GUTTER, y, T.px, 1); }
      c.fillStyle = INK;
      c.textAlign = "right";
      T.labels[k] = trackLabel(c, d.tracks[k], GUTTER - (clock ? 44 : 14));
      c.fillText(T.labels[k], GUTTER - 10, y + ROW / 2);
      if (clock) {
        c.save();
        c.font = "10px Inter, 'Segoe UI', system-ui, sans-serif";
        c.textAlign = "left";
        // the server names three clocks: "simulated" (a sim chip), "modelled host" (a sim run's fallback ops,
        // modelled, not measured) and "wall"; a modelled lane must not read as measured
        c.fillStyle = clock === "wall" ? MUTED : "#7c3aed";
        c.fillText(clock === "simulated" ? "sim" : clock === "wall" ? "wall" : "model", 4, y + ROW / 2);
        c.restore();
      }
    }
    counters(c, g);
    // axis and grid
    var ticks = niceTicks(T.t0, T.t1, Math.max(2, Math.floor(T.px / 110)));
    c.textAlign = "center";
    c.textBaseline = "top";
    ticks.values.forEach(function (t) {
      var x = GUTTER + toPx(t);
      if (x < GUTTER - 0.5 || x > GUTTER + T.px + 0.5) return;
      g.fillStyle = GRID;
      g.fillRect(Math.round(x), TOP, 1, bottom - TOP);
      c.fillStyle = MUTED;
      c.fillText(fmtTime(t, ticks.step), x, bottom + 4);
    });
    breaks(c, bottom);
    c.fillStyle = "#cbd2d9";
    c.fillRect(GUTTER, bottom, T.px, 1);
    c.textAlign = "left";
    c.fillStyle = MUTED;
    c.fillText("time since first op · window " + fmtDur(T.t1 - T.t0) + (d.clock ? " · " + d.clock : ""), GUTTER,
               bottom + 19);
    labels(c);
    // hover outline, drag selection
    var h = T.hover;
    if (h) {
      var a = GUTTER + Math.max(0, toPx(h.start)), z = GUTTER + Math.min(T.px, Math.max(toPx(h.end), toPx(h.start) + 1));
      c.strokeStyle = INK;
      c.lineWidth = 1.5;
      c.strokeRect(a - 1, TOP + h.track * ROW + PAD - 1, z - a + 2, ROW - 2 * PAD + 2);
    }
    flows(c);
    if (T.mark) {                           // the match Enter went to: a band, so a 50 ns span can be found
      var ma = toPx(T.mark.start), mz = Math.max(toPx(T.mark.end), ma + 2);
      if (mz > 0 && ma < T.px) {
        c.fillStyle = MARK;
        c.fillRect(GUTTER + Math.max(0, ma - 2), TOP, Math.min(T.px, mz + 2) - Math.max(0, ma - 2), T.ph - TOP);
      }
    }
    if (T.drag && !T.drag.pan && Math.abs(T.drag.x1 - T.drag.x0) > 3) {
      c.fillStyle = SEL;
      var lo = Math.min(T.drag.x0, T.drag.x1), hi = Math.max(T.drag.x0, T.drag.x1);
      c.fillRect(GUTTER + lo, TOP, hi - lo, T.ph - TOP);
    }
    if (window.opscopeTimelineTools) window.opscopeTimelineTools.overlay(c);
  }

  // An import's flows (a launch to its kernel, a forward op to its backward) that touch the picked or hovered
  // span: an arrow from one end to the other, as Perfetto draws them; all of them at once would be a hairball.
  function touching() {
    var d = T.data, f = d.flows, out = [], ends = [T.pickedSpan, T.hover && T.hover.kind === "span" ? T.hover : null];
    for (var i = 0; i < f.n; i++) {
      for (var j = 0; j < ends.length; j++) {
        var e = ends[j];
        if (e && ((f.fromTrack[i] === e.track && f.from[i] >= e.start && f.from[i] <= e.end) ||
                  (f.toTrack[i] === e.track && f.to[i] >= e.start && f.to[i] <= e.end))) { out.push(i); break; }
      }
    }
    return out;
  }

  function flows(c) {
    var f = T.data.flows;
    if (!f.n) return;
    c.save();
    c.strokeStyle = c.fillStyle = "#be123c";
    c.lineWidth = 1.5;
    touching().forEach(function (i) {
      var x0 = GUTTER + toPx(f.from[i]), y0 = TOP + f.fromTrack[i] * ROW + ROW / 2;
      var x1 = GUTTER + toPx(f.to[i]), y1 = TOP + f.toTrack[i] * ROW + ROW / 2;
      c.beginPath();
      c.moveTo(x0, y0);
      c.bezierCurveTo((x0 + x1) / 2, y0, (x0 + x1) / 2, y1, x1, y1);
      c.stroke();
      var a = Math.atan2(y1 - y0, Math.max(x1 - (x0 + x1) / 2, 1e-3));   // the curve arrives level with its end
      c.beginPath();
      c.moveTo(x1, y1);
      c.lineTo(x1 - 7 * Math.cos(a - 0.45), y1 - 7 * Math.sin(a - 0.45));
      c.lineTo(x1 - 7 * Math.cos(a + 0.45), y1 - 7 * Math.sin(a + 0.45));
      c.closePath();
      c.fill();
    });
    c.restore();
  }

  // Counter tracks under the spans (memory, CPU, ...), as Perfetto and Nsight draw them: a step line filled
  // to zero, scaled to the series' own peak over the whole run, its name and peak in the gutter.
  function counters(c, g) {
    var d = T.data;
    d.counters.forEach(function (s, i) {
      var y0 = T.ph + i * CROW, h = CROW - 8, base = y0 + CROW - 3, peak = s.max || 1;
      g.fillStyle = "#eef1f4";
      g.fillRect(GUTTER, y0, T.px, 1);
      c.save();
      c.textAlign = "right";
      c.textBaseline = "middle";
      c.fillStyle = INK;
      c.font = "12px Inter, 'Segoe UI', system-ui, sans-serif";
      c.fillText(trackLabel(c, s.name, GUTTER - 14), GUTTER - 10, y0 + CROW / 2 - 6);
      c.fillStyle = MUTED;
      c.font = "10px Inter, 'Segoe UI', system-ui, sans-serif";
      c.fillText("peak " + fmtValue(peak, s.unit), GUTTER - 10, y0 + CROW / 2 + 8);
      c.restore();
      if (!s.n) return;
      g.save();
      g.beginPath();
      g.rect(GUTTER, y0, T.px, CROW);
      g.clip();
      g.beginPath();
      var py = base;
      g.moveTo(GUTTER + toPx(s.t[0]), base);
      for (var j = 0; j < s.n; j++) {                 // a step line: a sample holds until the next one
        var nx = GUTTER + toPx(s.t[j]), ny = base - h * Math.max(0, s.v[j]) / peak;
        g.lineTo(nx, j ? py : ny);
        g.lineTo(nx, ny);
        py = ny;
      }
      g.lineTo(GUTTER + T.px, py);
      g.lineTo(GUTTER + T.px, base);
      g.closePath();
      g.fillStyle = "rgba(37,99,235,0.15)";
      g.fill();
      g.strokeStyle = "#2563eb";
      g.lineWidth = 1.2;
      g.stroke();
      g.restore();
    });
  }

  function fmtValue(v, unit) {
    if (unit === "bytes") {
      var u = ["B", "KiB", "MiB", "GiB", "TiB"], k = 0;
      while (Math.abs(v) >= 1024 && k < u.length - 1) { v /= 1024; k++; }
      return v.toFixed(k ? 1 : 0) + " " + u[k];
    }
    return (Math.round(v * 10) / 10) + " " + unit;
  }

  // Where host time between simulated steps was collapsed: a dashed line through every track.
  function breaks(c, bottom) {
    var br = T.data.breaks || [];
    c.save();
    c.strokeStyle = "#7c3aed";
    c.setLineDash([4, 3]);
    c.lineWidth = 1;
    br.forEach(function (b) {
      var x = GUTTER + toPx(b[0]);
      if (x < GUTTER || x > GUTTER + T.px) return;
      c.beginPath();
      c.moveTo(Math.round(x) + 0.5, TOP);
      c.lineTo(Math.round(x) + 0.5, bottom);
      c.stroke();
    });
    c.restore();
  }

  // Names inside spans wide enough to hold them, the way trace viewers label slices.
  function labels(c) {
    var d = T.data, s = d.spans, drawn = 0;
    c.save();
    c.beginPath();
    c.rect(GUTTER, 0, T.px, T.ph);
    c.clip();
    c.textAlign = "left";
    c.textBaseline = "middle";
    c.font = "11px Inter, 'Segoe UI', system-ui, sans-serif";
    for (var i = 0; i < s.n && drawn < 600; i++) {
      var a = Math.max(0, toPx(s.start[i])), z = Math.min(T.px, toPx(s.end[i]));
      // a label stops where the next span of its lane starts: steps of ranks that overlap drew 'step 0' and
      // 'step 1' on top of each other
      if (i + 1 < s.n && s.track[i + 1] === s.track[i] && s.start[i + 1] > s.start[i]) {
        z = Math.min(z, toPx(s.start[i + 1]));
      }
      if (z - a < LABEL_MIN_PX || d.find && !d.hit[s.label[i]]) continue;
      var rgb = d.rgb[s.label[i]], dark = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] < 150;
      c.fillStyle = dark ? "#ffffff" : INK;
      c.fillText(ellipsize(c, d.names[s.label[i]], z - a - 8), GUTTER + a + 4, TOP + s.track[i] * ROW + ROW / 2);
      drawn++;
    }
    c.restore();
  }

  // A track's label keeps its last part ("torch:cpu · t4242 · annotations" -> "torch:cpu · t4… · annotations"):
  // that part tells a thread's lanes apart, and cut from the end every lane of a thread read the same.
  function trackLabel(c, text, width) {
    if (c.measureText(text).width <= width) return text;
    var cut = text.lastIndexOf(" · ");
    if (cut > 0) {
      var tail = text.slice(cut), room = width - c.measureText(tail).width;
      var head = room > 0 ? ellipsize(c, text.slice(0, cut), room) : "";
      if (head) return head + tail;
    }
    return ellipsize(c, text, width);
  }

  function ellipsize(c, text, width) {
    if (c.measureText(text).width <= width) return text;
    var lo = 0, hi = text.length;
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (c.measureText(text.slice(0, mid) + "…").width <= width) lo = mid; else hi = mid - 1;
    }
    return lo ? text.slice(0, lo) + "…" : "";
  }

  function niceTicks(t0, t1, n) {
    var raw = (t1 - t0) / n, mag = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1e-9)))), step = mag;
    [1, 2, 5, 10].some(function (m) { step = m * mag; return step >= raw; });
    var out = [];
    for (var t = Math.ceil(t0 / step) * step; t <= t1 && out.length < 200; t += step) out.push(t);
    return {values: out, step: step};
  }

  function unit(step) {
    return step >= 1e9 ? [1e9, "s"] : step >= 1e6 ? [1e6, "ms"] : step >= 1e3 ? [1e3, "us"] : [1, "ns"];
  }

  // Tick labels in the unit of the window's position, with the digits the tick step needs:
  // a 20 us step 223 ms into the run reads "223.52 ms", not "223520 us".
  function fmtTime(t, step) {
    var u = unit(Math.max(Math.abs(T.t0), Math.abs(T.t1), step));
    var digits = Math.max(0, Math.ceil(-Math.log10(step / u[0]) - 1e-9));
    return (t / u[0]).toFixed(Math.min(digits, 9)) + " " + u[1];
  }

  function fmtDur(ns) {                  // as the tables write it (assets/formats.js, which Dash loads on every page)
    if (!ns) return "0";                  // views cost nothing on a simulated clock
    return window.dashAgGridFunctions.duration(ns);
  }

  // --- the view: zoom and pan ---------------------------------------------------------------
  function setView(t0, t1) {
    var minW = 100, slack = T.end * 0.05 + 1;
    if (t1 - t0 < minW) { var m = (t0 + t1) / 2; t0 = m - minW / 2; t1 = m + minW / 2; }
    var w = t1 - t0;
    if (w > T.end + 2 * slack) { t0 = -slack; t1 = T.end + slack; w = t1 - t0; }
    if (t0 < -slack) { t0 = -slack; t1 = t0 + w; }
    if (t1 > T.end + slack) { t1 = T.end + slack; t0 = t1 - w; }
    T.t0 = t0;
    T.t1 = t1;
    T.hover = null;
    T.tip.style.display = "none";
    draw();
    clearTimeout(T.timer);
    T.timer = setTimeout(function () { refetch(false); }, FETCH_DELAY_MS);
  }

  function zoomAt(x, factor) {
    var t = toT(x);
    setView(t - (t - T.t0) * factor, t + (T.t1 - t) * factor);
  }

  function pan(fraction) {
    var w = T.t1 - T.t0;
    setView(T.t0 + w * fraction, T.t1 + w * fraction);
  }

  function plotX(e) {
    var r = T.over.getBoundingClientRect();
    return {x: e.clientX - r.left - GUTTER, y: e.clientY - r.top};
  }

  function onWheel(e) {
    if (!T.data) return;
    e.preventDefault();
    var p = plotX(e), dy = e.deltaY * (e.deltaMode === 1 ? 30 : 1), dx = e.deltaX * (e.deltaMode === 1 ? 30 : 1);
    if (e.shiftKey || Math.abs(dx) > Math.abs(dy)) pan((e.shiftKey ? dy : dx) / T.px);
    else zoomAt(Math.min(Math.max(p.x, 0), T.px), Math.exp(dy * 0.0015));
  }

  function onDown(e) {
    if (e.button !== 0 || !T.data) return;
    var p = plotX(e);
    if (window.opscopeTimelineTools && window.opscopeTimelineTools.down(e, p)) return;   // a pin, an area, a measure
    if (p.x < 0 || p.x > T.px) return;
    e.preventDefault();
    T.drag = {x0: p.x, x1: p.x, pan: e.shiftKey, t0: T.t0, t1: T.t1};
    window.addEventListener("mousemove", onDrag);
    window.addEventListener("mouseup", onUp, {once: true});
  }

  function onDrag(e) {
    var d = T && T.drag;
    if (!d) return;
    d.x1 = plotX(e).x;
    if (d.pan) {
      var dt = (d.x1 - d.x0) / T.px * (d.t1 - d.t0);
      setView(d.t0 - dt, d.t1 - dt);
    } else {
      draw();
    }
  }

  function onUp(e) {
    window.removeEventListener("mousemove", onDrag);
    var d = T && T.drag;
    if (!d) return;
    T.drag = null;
    if (Math.abs(d.x1 - d.x0) <= 3) { pick(plotX(e)); draw(); return; }
    if (!d.pan) {
      var lo = Math.max(0, Math.min(d.x0, d.x1)), hi = Math.min(T.px, Math.max(d.x0, d.x1));
      setView(toT(lo), toT(hi));
    }
  }

  // Enter in the find box: the next match (Shift+Enter: the previous), centered and zoomed to be seen,
  // its details shown. Asked of the server, which holds every span, not only the drawn ones.
  function gotoMatch(text, forward) {
    if (!T || !T.view || !text.trim()) return;
    var from = T.mark && T.mark.find === text ? T.mark.start : (forward ? T.t0 : T.t1);
    var q = "run=" + encodeURIComponent(T.view.run) + "&find=" + encodeURIComponent(text) +
            "&goto=" + (forward ? "next" : "prev") + "&at=" + Math.round(from);
    fetch(prefix() + "_opscope/timeline?" + q, {credentials: "same-origin"}).then(window.opscopeJson).then(function (p) {
      if (!T || !p.goto) { if (T && p.goto === null) info("no span matches " + JSON.stringify(text)); return; }
      var g = p.goto, dur = g.end - g.start, w = T.t1 - T.t0, mid = (g.start + g.end) / 2;
      if (dur > 0.8 * w) w = dur * 1.25;
      else if (dur / w * T.px < 2) w = Math.max(dur * 60, 2000);     // too small to see here: zoom in on it
      T.mark = {start: g.start, end: g.end, find: text, key: g.key};
      T.picked = g.key;
      setView(mid - w / 2, mid + w / 2);
      if (window.dash_clientside && window.dash_clientside.set_props) window.dash_clientside.set_props(PICKED, {data: g.key});
    }).catch(failed);
  }

  document.addEventListener("keydown", function (e) {
    var t0 = e.target;
    if (t0 && t0.id === FIND && e.key === "Enter") { gotoMatch(t0.value, !e.shiftKey); return; }
    if (!T || !T.data || !document.body.contains(T.host)) return;
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    var t = e.target;
    if (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.isContentEditable)) return;
    var key = (e.key || "").toLowerCase();
    if (key.length !== 1 || "wasd".indexOf(key) < 0) return;
    e.preventDefault();
    var x = T.mouse ? T.mouse.x : T.px / 2;
    if (key === "w") zoomAt(x, ZOOM);
    else if (key === "s") zoomAt(x, 1 / ZOOM);
    else pan(key === "a" ? -PAN : PAN);
  });

  // --- hover and click ----------------------------------------------------------------------
  function hit(p) {
    var d = T.data;
    if (!d || p.x < 0 || p.x > T.px) return null;
    var track = Math.floor((p.y - TOP) / ROW);
    if (track < 0 || track >= d.tracks.length) return null;
    var t = toT(p.x), tol = 3 / T.px * (T.t1 - T.t0), best = null, bestD = Infinity;
    function consider(kind, i, start, end) {
      var dist = t < start ? start - t : t > end ? t - end : 0;
      if (dist <= tol && (dist < bestD || dist === bestD && best && end - start < best.end - best.start)) {
        bestD = dist;
        best = {kind: kind, i: i, start: start, end: end, track: track};
      }
    }
    var s = d.spans, b = d.buckets;
    for (var i = 0; i < s.n; i++) if (s.track[i] === track) consider("span", i, s.start[i], s.end[i]);
    if (!best || bestD > 0) for (i = 0; i < b.n; i++) if (b.track[i] === track) consider("bucket", i, b.start[i], b.end[i]);
    return best;
  }

  function describe(h) {
    var d = T.data;
    if (h.kind === "bucket") {
      var b = d.buckets;
      return "<b>" + b.count[h.i].toLocaleString() + " spans too small to draw</b><br>busy " +
        fmtDur(b.busy[h.i]) + " · zoom in to see them";
    }
    var s = d.spans, k = s.label[h.i], name = esc(d.names[k]), dur = fmtDur(s.end[h.i] - s.start[h.i]);
    if (s.key0[h.i] === STEP_KEY) return "<b>" + name + "</b><br>" + dur + " from its first op to its last";
    if (s.key0[h.i] === PHASE_KEY) return "<b>" + name + "</b><br>" + dur + " · step " + Math.floor(s.key1[h.i] / 8);
    if (k >= d.frames_from) return "<b>" + name + "</b><br>" + dur + " · python frame";
    if (s.key0[h.i] === ANNOTATION_KEY) return "<b>" + name + "</b><br>" + dur + " · " + esc(d.tracks[h.track]);
    var group = d.groups[k] !== d.names[k] ? esc(d.groups[k]) + " · " : "";
    return "<b>" + name + "</b><br>" + group + dur + " · step " + s.key0[h.i] + " · #" + s.key1[h.i];
  }

  function esc(text) {
    return String(text).replace(/[&<>"]/g, function (ch) { return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[ch]; });
  }

  function onHover(e) {
    if (!T.data || T.drag) return;
    var p = plotX(e);
    T.mouse = p;
    var h = hit(p);
    var same = h && T.hover && h.kind === T.hover.kind && h.i === T.hover.i;
    T.hover = h;
    if (!h) { T.tip.style.display = "none"; draw(); return; }
    T.tip.innerHTML = describe(h);
    T.tip.style.display = "block";
    var left = GUTTER + p.x + 14, tw = T.tip.offsetWidth;
    if (left + tw > T.w) left = GUTTER + p.x - tw - 14;
    T.tip.style.left = left + "px";
    T.tip.style.top = (TOP + h.track * ROW + ROW) + "px";
    if (!same) draw();
  }

  function pick(p) {
    var h = hit(p), d = T.data;
    if (!h) return;
    T.hover = h;
    var row;
    if (h.kind === "bucket") row = [-1, d.buckets.count[h.i], d.buckets.busy[h.i] / 1e3];
    else row = [d.spans.key0[h.i], d.spans.key1[h.i], (d.spans.end[h.i] - d.spans.start[h.i]) / 1e3];
    T.picked = row;
    T.pickedSpan = h.kind === "span" ? {start: h.start, end: h.end, track: h.track} : null;   // its flows drawn
    draw();
    if (window.dash_clientside && window.dash_clientside.set_props) window.dash_clientside.set_props(PICKED, {data: row});
  }

  window.addEventListener("resize", function () {
    if (!T || !T.data) return;
    resize();
    draw();
    clearTimeout(T.timer);
    T.timer = setTimeout(function () { refetch(false); }, 150);
  });

  // What the page, the tests and the benchmark read: the view, what was drawn, where a span lies on screen.
  window.opscopeTimeline = {
    follow: follow,
    state: function () {
      return T && {t0: T.t0, t1: T.t1, shown: T.shown, fetches: T.fetches, draws: T.draws, gl: !!T.gl,
                   spans: T.data ? T.data.spans.n : 0, buckets: T.data ? T.data.buckets.n : 0,
                   busy: !!T.inflight, picked: T.picked || null, find: T.data ? T.data.find || "" : "",
                   appended: T.data ? T.data.appended || 0 : 0, live: !!(T.data && T.data.status === "running"),
                   mark: T.mark || null, uploaded: T.uploaded || 0};
    },
    setView: function (t0, t1) { if (T && T.data) setView(t0, t1); },
    // The names of the spans drawn on the track labelled `track` (tests: the phase band, a lane of annotations).
    namesOn: function (track) {
      var d = T && T.data, s = d && d.spans, k = d ? d.tracks.indexOf(track) : -1, out = {};
      for (var i = 0; k >= 0 && i < s.n; i++) if (s.track[i] === k) out[d.names[s.label[i]]] = 1;
      return Object.keys(out).sort();
    },
    tracks: function () { return T && T.data ? T.data.tracks.slice() : []; },
    // What assets/timeline_tools.js (area selection, pins, measure) draws with: the mounted timeline and its geometry.
    tools: {get: function () { return T; }, toPx: function (t) { return toPx(t); }, toT: function (x) { return toT(x); },
            draw: function () { draw(); }, upload: function () { upload(); }, plotX: function (e) { return plotX(e); },
            ROW: ROW, TOP: TOP, GUTTER: GUTTER, PAD: PAD},
    // The track labels as drawn in the gutter (a long one shortened), one per track.
    labels: function () { return T && T.labels ? T.labels.slice() : []; },
    // The flows drawn now (touching the picked or hovered span): [{from, fromTrack, to, toTrack}] with track labels.
    flowsDrawn: function () {
      if (!T || !T.data) return [];
      var d = T.data, f = d.flows;
      return touching().map(function (i) {
        return {from: f.from[i], fromTrack: d.tracks[f.fromTrack[i]], to: f.to[i], toTrack: d.tracks[f.toTrack[i]]};
      });
    },
    // Where the drawn span with this key lies on the axis (ns since the first span), or null.
    spanAt: function (key0, key1) {
      var d = T && T.data, s = d && d.spans;
      for (var i = 0; s && i < s.n; i++) if (s.key0[i] === key0 && s.key1[i] === key1) return {start: s.start[i], end: s.end[i]};
      return null;
    },
    // The client point at the middle of the drawn span with this key (step, seq), or null (for a real click).
    pointOf: function (key0, key1) {
      var d = T && T.data, s = d && d.spans;
      for (var i = 0; s && i < s.n; i++) {
        if (s.key0[i] !== key0 || s.key1[i] !== key1) continue;
        var r = T.over.getBoundingClientRect(), a = Math.max(0, toPx(s.start[i])), z = Math.min(T.px, toPx(s.end[i]));
        return {x: r.left + GUTTER + (a + z) / 2, y: r.top + TOP + s.track[i] * ROW + ROW / 2};
      }
      return null;
    },
    // Select a span by its key and center it (the details panel's "backward of NODE" link)
    select: function (target) {
      if (!T || !T.data || !target) return;
      var pad = Math.max((target.end - target.start) * 4, (T.t1 - T.t0) / 8);
      setView(Math.max(0, target.start - pad), target.end + pad);
      T.picked = target.key;
      T.mark = {start: target.start, end: target.end, find: T.data.find || "", key: target.key};
      if (window.dash_clientside && window.dash_clientside.set_props) window.dash_clientside.set_props(PICKED, {data: target.key});
    },
    // The client point at the middle of the widest span drawn (skipping Python frames), for a real click.
    widestSpanPoint: function () {
      var d = T && T.data, s = d && d.spans, best = -1, bw = -1;
      for (var i = 0; s && i < s.n; i++) {
        var w = Math.min(T.px, toPx(s.end[i])) - Math.max(0, toPx(s.start[i]));
        if (s.label[i] < d.frames_from && w > bw) { bw = w; best = i; }
      }
      if (best < 0) return null;
      var r = T.over.getBoundingClientRect(), a = Math.max(0, toPx(s.start[best])), z = Math.min(T.px, toPx(s.end[best]));
      return {x: r.left + GUTTER + (a + z) / 2, y: r.top + TOP + s.track[best] * ROW + ROW / 2,
              key0: s.key0[best], key1: s.key1[best]};
    }
  };
})();
