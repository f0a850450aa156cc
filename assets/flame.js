// The flame graph page's icicle (app/pages/flame.py): the root on top, each frame as wide as its total time,
// its callees beneath it. Hover: total and self time; click: zoom into a frame (its ancestors stay as full-width
// bars above it); click the top bar, an ancestor or double-click: zoom back out.
(function () {
  "use strict";
  var ROW = 20, HOST = "flame-graph", INK = "#1f2933";
  var F = null;          // {tree, host, canvas, tip, crumb, focus, w, hover}

  function dur(ns) { return window.dashAgGridFunctions ? window.dashAgGridFunctions.duration(ns) : ns + " ns"; }

  function esc(text) {
    return String(text).replace(/[&<>"]/g, function (ch) { return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[ch]; });
  }

  // A warm color per name (flame graphs' convention), the same name the same color on every visit.
  function color(name, kind) {
    var h = 0;
    for (var i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) | 0;
    var u = (h >>> 0) / 4294967295;
    if (kind === "ops") return "hsl(" + Math.round(195 + 50 * u) + ", 62%, " + Math.round(62 + 14 * u) + "%)";
    return "hsl(" + Math.round(8 + 38 * u) + ", 88%, " + Math.round(60 + 12 * u) + "%)";
  }

  function draw(tree) {
    var host = document.getElementById(HOST);
    if (!host) { F = null; return; }
    if (!tree) return;
    if (tree.message) { host.innerHTML = '<div class="note note-info">' + esc(tree.message) + "</div>"; F = null; return; }
    host.innerHTML = "";
    var crumb = document.createElement("div"), canvas = document.createElement("canvas"), tip = document.createElement("div");
    crumb.className = "flame-crumb";
    canvas.className = "flame-gl";
    tip.className = "tl-tip";
    var stage = document.createElement("div");
    stage.className = "flame-stage";
    stage.appendChild(canvas);
    stage.appendChild(tip);
    host.appendChild(crumb);
    host.appendChild(stage);
    F = {tree: tree, host: host, canvas: canvas, tip: tip, crumb: crumb, focus: 0, hover: -1, draws: 0,
         maxDepth: Math.max.apply(null, tree.depth)};
    canvas.addEventListener("mousemove", onMove);
    canvas.addEventListener("mouseleave", function () { F.hover = -1; tip.style.display = "none"; paint(); });
    canvas.addEventListener("click", function (e) { var i = at(e); if (i >= 0) zoom(i === F.focus ? parentOf(i) : i); });
    canvas.addEventListener("dblclick", function () { zoom(0); });
    paint();
  }

  function parentOf(i) { var p = F.tree.parent[i]; return p >= 0 ? p : 0; }

  function zoom(i) {
    if (!F) return;
    F.focus = i;
    F.hover = -1;
    F.tip.style.display = "none";
    paint();
  }

  function range() {
    var t = F.tree, f = F.focus;
    return [t.x[f], Math.max(t.total[f], 1e-9)];
  }

  // The nodes on the path from the root to the focus, drawn full width above it.
  function ancestors() {
    var out = {}, i = F.focus;
    while (i >= 0) { out[i] = true; i = F.tree.parent[i]; }
    return out;
  }

  function paint() {
    var t = F.tree, c = F.canvas, w = Math.max(300, F.host.clientWidth || 1200), dpr = window.devicePixelRatio || 1;
    var rows = F.maxDepth + 1, h = rows * ROW + 2, r = range(), anc = ancestors(), fd = t.depth[F.focus];
    F.w = w;
    c.style.width = w + "px";
    c.style.height = h + "px";
    c.width = Math.round(w * dpr);
    c.height = Math.round(h * dpr);
    var g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    g.font = "11.5px Inter, 'Segoe UI', system-ui, sans-serif";
    g.textBaseline = "middle";
    F.boxes = [];
    for (var i = 0; i < t.name.length; i++) {
      var a, z;
      if (t.depth[i] <= fd) {
        if (!anc[i]) continue;
        a = 0; z = w;                                   // the focus and its ancestors span the width
      } else {
        a = (t.x[i] - r[0]) / r[1] * w;
        z = (t.x[i] + t.total[i] - r[0]) / r[1] * w;
        if (z <= 0 || a >= w || z - a < 0.5) continue;
      }
      var y = t.depth[i] * ROW;
      g.fillStyle = i === 0 ? "#cbd2d9" : t.depth[i] < fd || (t.depth[i] === fd && i !== F.focus)
        ? "#e5e7eb" : color(t.name[i], t.kind);
      g.fillRect(a, y + 1, Math.max(z - a - 1, 0.5), ROW - 2);
      if (i === F.hover) { g.strokeStyle = INK; g.lineWidth = 1.5; g.strokeRect(a + 0.5, y + 1.5, Math.max(z - a - 2, 1), ROW - 3); }
      F.boxes.push([i, a, z, y]);
      if (z - a > 28) {
        g.fillStyle = INK;
        g.fillText(fit(g, t.name[i], z - a - 8), a + 4, y + ROW / 2);
      }
    }
    F.draws++;
    crumbs();
  }

  function fit(g, text, width) {
    if (g.measureText(text).width <= width) return text;
    var lo = 0, hi = text.length;
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (g.measureText(text.slice(0, mid) + "…").width <= width) lo = mid; else hi = mid - 1;
    }
    return lo ? text.slice(0, lo) + "…" : "";
  }

  function crumbs() {
    var t = F.tree, path = [], i = F.focus;
    while (i >= 0) { path.unshift(i); i = t.parent[i]; }
    var share = 100 * t.total[F.focus] / Math.max(t.root_total, 1e-9);
    F.crumb.innerHTML = (F.focus ? '<button class="link-button flame-out">whole tree</button> · ' : "") +
      path.map(function (k) { return esc(t.name[k]); }).join(" › ") +
      ' <span class="muted">· ' + dur(t.total[F.focus]) + " (" + share.toFixed(1) + " % of " + dur(t.root_total) +
      ")" + (t.left_out > 0 ? " · " + t.left_out.toLocaleString() +
      " frame" + (t.left_out > 1 ? "s" : "") + " of (almost) no time left out" : "") + "</span>";
    var out = F.crumb.querySelector(".flame-out");
    if (out) out.addEventListener("click", function () { zoom(0); });
  }

  function at(e) {
    if (!F || !F.boxes) return -1;
    var rc = F.canvas.getBoundingClientRect(), x = e.clientX - rc.left, y = e.clientY - rc.top;
    for (var k = F.boxes.length - 1; k >= 0; k--) {
      var b = F.boxes[k];
      if (x >= b[1] && x <= b[2] && y >= b[3] && y < b[3] + ROW) return b[0];
    }
    return -1;
  }

  function onMove(e) {
    var i = at(e), t = F.tree;
    if (i !== F.hover) { F.hover = i; paint(); }
    if (i < 0) { F.tip.style.display = "none"; return; }
    var root = Math.max(t.root_total, 1e-9);
    F.tip.innerHTML = "<b>" + esc(t.name[i]) + "</b><br>total " + dur(t.total[i]) + " (" +
      (100 * t.total[i] / root).toFixed(1) + " %) · self " + dur(t.self[i]) + " (" + (100 * t.self[i] / root).toFixed(1) +
      " %)<br>" + t.calls[i].toLocaleString() + (t.kind === "ops" ? " op calls" : " spans") + " · click to zoom in";
    F.tip.style.display = "block";
    var rc = F.canvas.getBoundingClientRect(), x = e.clientX - rc.left + 14;
    if (x + F.tip.offsetWidth > F.w) x = e.clientX - rc.left - F.tip.offsetWidth - 14;
    F.tip.style.left = x + "px";
    F.tip.style.top = (t.depth[i] * ROW + ROW + 4) + "px";
  }

  window.opscopeFlame = {
    draw: draw,
    zoom: zoom,
    // What the tests read: the focus, what was drawn, where a node with this name lies on screen.
    state: function () {
      return F && {focus: F.focus, focusName: F.tree.name[F.focus], draws: F.draws, nodes: F.tree.name.length,
                   drawn: F.boxes ? F.boxes.length : 0, kind: F.tree.kind, root: F.tree.name[0]};
    },
    pointOf: function (name) {
      if (!F || !F.boxes) return null;
      var rc = F.canvas.getBoundingClientRect(), best = null;
      F.boxes.forEach(function (b) {
        if (F.tree.name[b[0]] === name && (!best || b[2] - b[1] > best[2] - best[1])) best = b;
      });
      return best && {x: rc.left + (best[1] + best[2]) / 2, y: rc.top + best[3] + ROW / 2, i: best[0]};
    },
    node: function (i) {
      var t = F && F.tree;
      return t && {name: t.name[i], total: t.total[i], self: t.self[i], calls: t.calls[i], depth: t.depth[i]};
    }
  };
  window.addEventListener("resize", function () { if (F && document.body.contains(F.host)) paint(); });
})();
