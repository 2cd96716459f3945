// Zoom, reset and search for mtrace's flame graph (Mtrace.Flamegraph), kept
// in the SVG itself so that the file needs nothing else. Boxes are
// <g class="f" data-name="..."> holding a <rect> and an optional <text>.
(function () {
  "use strict";
  var doc = document, svg = doc.documentElement;
  var pad = +svg.getAttribute("data-pad"), width = +svg.getAttribute("width");
  var charWidth = +svg.getAttribute("data-char-width");
  var full = width - 2 * pad;
  var boxes = [].slice.call(doc.querySelectorAll("g.f"));
  var resetButton = doc.getElementById("reset"), matchedText = doc.getElementById("matched");

  // Boxes come in pre-order (a box, then the boxes above it in the stack,
  // each drawn one row lower): a box's parent is the last box before it in
  // a row above, and its descendants are the boxes after it until one in
  // its row or above. The tree, not the boxes' rounded positions, says
  // which boxes a zoom keeps.
  var open = [];
  boxes.forEach(function (g, i) {
    var r = g.querySelector("rect");
    g.x0 = +r.getAttribute("x");
    g.w0 = +r.getAttribute("width");
    g.y0 = +r.getAttribute("y");
    g.fill0 = r.getAttribute("fill");
    g.index = i;
    while (open.length && open[open.length - 1].y0 >= g.y0) open.pop();
    g.parentBox = open.length ? open[open.length - 1] : null;
    open.push(g);
    g.addEventListener("click", function () { zoom(g); });
  });

  // The name, or as much of it as fits followed by "..", as the server did.
  function label(g, w) {
    var t = g.querySelector("text"), name = g.getAttribute("data-name");
    var chars = Math.floor((w - 6) / charWidth);
    var text = name.length <= chars ? name : chars < 3 ? "" : name.slice(0, chars - 2) + "..";
    if (!t) {
      if (!text) return;
      t = doc.createElementNS("http://www.w3.org/2000/svg", "text");
      g.appendChild(t);
    }
    t.setAttribute("x", +g.querySelector("rect").getAttribute("x") + 3);
    t.setAttribute("y", g.y0 + 12);
    t.textContent = text;
  }

  function place(g, x, w, shown) {
    var r = g.querySelector("rect");
    g.style.display = shown ? "" : "none";
    if (!shown) return;
    r.setAttribute("x", x);
    r.setAttribute("width", w);
    label(g, w);
  }

  // The clicked box fills the width; what is below it scales with it, what
  // holds it (above) spans the width, dimmed; everything else is hidden.
  function zoom(target) {
    var x0 = target.x0, scale = full / target.w0, last = target.index, holds = {};
    while (last + 1 < boxes.length && boxes[last + 1].y0 > target.y0) last++;
    for (var p = target.parentBox; p; p = p.parentBox) holds[p.index] = true;
    boxes.forEach(function (g) {
      var within = g.index >= target.index && g.index <= last;
      if (within) place(g, pad + (g.x0 - x0) * scale, g.w0 * scale, true);
      else if (holds[g.index]) place(g, pad, full, true);
      else place(g, 0, 0, false);
      g.style.opacity = holds[g.index] ? "0.6" : "";
    });
    resetButton.style.display = "";
  }

  function reset() {
    boxes.forEach(function (g) {
      place(g, g.x0, g.w0, true);
      g.style.opacity = "";
    });
    resetButton.style.display = "none";
  }

  // Highlights the boxes whose name matches; the matched share counts each
  // stretch of the width once (a match inside a match adds nothing).
  function search(term) {
    var re, spans = [];
    try { re = new RegExp(term); } catch (e) { return null; }
    boxes.forEach(function (g) {
      var hit = term !== "" && re.test(g.getAttribute("data-name"));
      g.querySelector("rect").setAttribute("fill", hit ? "rgb(230,0,230)" : g.fill0);
      if (hit) spans.push([g.x0, g.x0 + g.w0]);
    });
    spans.sort(function (a, b) { return a[0] - b[0]; });
    var covered = 0, end = -Infinity;
    spans.forEach(function (s) {
      if (s[0] > end) { covered += s[1] - s[0]; end = s[1]; }
      else if (s[1] > end) { covered += s[1] - end; end = s[1]; }
    });
    var share = full > 0 ? 100 * covered / full : 0;
    matchedText.textContent = term === "" ? "" : "Matched: " + share.toFixed(1) + "%";
    return share;
  }

  resetButton.addEventListener("click", reset);
  doc.getElementById("search").addEventListener("click", function () {
    var term = window.prompt("Search (a regular expression)", "");
    if (term !== null) search(term);
  });
  // For scripts and tests: the same actions without a mouse.
  window.mtrace = { zoom: function (name) {
    var g = boxes.filter(function (b) { return b.getAttribute("data-name") === name; })[0];
    if (g) zoom(g);
    return !!g;
  }, reset: reset, search: search };
})();
