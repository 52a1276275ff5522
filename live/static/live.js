// tokentap live page (docs/live.md). Polls /live/data and /probes while
// open; draws every finished request as a strip of its token events on
// one time axis. Text from the records goes into the page as text only.
"use strict";
(function () {
  var SVGNS = "http://www.w3.org/2000/svg";
  var POLL_MS = 2000, CANARY_MS = 5000;
  var ROW = 16, BAR = 12, TOP = 22, LEFT = 150, RIGHT = 40;
  var seq = null, records = [], selected = null, threshold = 1000;
  var params = new URLSearchParams(location.search);
  var wanted = params.get("n") || "30";
  var tenant = params.get("tenant") || "";

  function el(tag, attrs, parent) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function html(tag, text, parent, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    if (cls) e.className = cls;
    if (parent) parent.appendChild(e);
    return e;
  }
  function clear(e) { while (e.firstChild) e.removeChild(e.firstChild); }
  function fmt(v, digits) {
    if (v === null || v === undefined || isNaN(v)) return "–";
    var a = Math.abs(v);
    if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(2);
    return (+v.toFixed(digits === undefined ? 3 : digits)).toString();
  }

  // verdict: met when every SLO verdict qualified, missed when one did
  // not (excluded verdicts aside), none without a verdict.
  function verdict(r) {
    var vs = (r.slo || []).filter(function (v) { return !v.excluded; });
    if (vs.length === 0) return "none";
    return vs.every(function (v) { return v.qualified; }) ? "met" : "missed";
  }
  var FILL = { met: "#d7f0d2", missed: "#f8d0d0", none: "#e4e4e4" };

  // arriveMs is the record's start in ms since the epoch, with the
  // sub-millisecond digits that Date.parse drops.
  function arriveMs(s) {
    var m = s.match(/\.\d{3}(\d+)/);
    return Date.parse(s) + (m ? parseFloat("0." + m[1]) : 0);
  }

  // end is the record's last known instant, in ms from its arrival.
  function end(r) {
    var t = r.terminal_ms;
    if (t === null || t === undefined) {
      var tm = r.token_ms || [];
      t = tm.length ? tm[tm.length - 1] : (r.ttfb_ms || 0);
    }
    return t;
  }

  // why describes one slow event's cause (docs/measurement.md §6b):
  // the cause, the milliseconds it explains, the request it points to
  // (by record id, never content).
  function why(c) {
    return (c.what === "ttft" ? "slow first token" : "stall at " + fmt(c.at_ms, 1) + " ms") + ": " + c.cause + ", " +
      fmt(c.ms, 1) + " ms" + (c.ref ? ", request " + c.ref : "");
  }
  // causeOf returns the record's cause of its first token (atMs null)
  // or of the stall that starts at atMs; null when none.
  function causeOf(r, what, atMs) {
    var cs = r.causes || [];
    for (var i = 0; i < cs.length; i++) {
      if (cs[i].what === what && (atMs === null || Math.abs(cs[i].at_ms - atMs) < 0.002)) return cs[i];
    }
    return null;
  }
  // causeAttrs are the data attributes of a mark with a cause.
  function causeAttrs(attrs, c) {
    if (c) { attrs["data-cause"] = c.cause; attrs["data-ms"] = c.ms; if (c.ref) attrs["data-ref"] = c.ref; }
    return attrs;
  }
  // markRefs outlines the strips r's causes point to.
  function markRefs(r) {
    var svg = document.getElementById("strips");
    svg.querySelectorAll(".strip.ref").forEach(function (s) { s.classList.remove("ref"); });
    (r && r.causes || []).forEach(function (c) {
      if (!c.ref) return;
      svg.querySelectorAll(".strip").forEach(function (s) { if (s.getAttribute("data-id") === c.ref) s.classList.add("ref"); });
    });
  }

  function drawStrips() {
    var svg = document.getElementById("strips");
    clear(svg);
    document.getElementById("count").textContent = records.length;
    var width = Math.max(svg.parentNode.clientWidth, 400);
    var height = TOP + records.length * ROW + 4;
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    if (records.length === 0) {
      el("text", { x: 4, y: 16, "font-size": 12 }, svg).textContent = "no finished request yet";
      return;
    }
    var t0 = Infinity, t1 = -Infinity;
    records.forEach(function (r) {
      r._arrive = arriveMs(r.start);
      t0 = Math.min(t0, r._arrive);
      t1 = Math.max(t1, r._arrive + end(r));
    });
    if (t1 <= t0) t1 = t0 + 1;
    var pw = width - LEFT - RIGHT;
    var scale = pw / (t1 - t0);
    function x(ms) { return LEFT + (ms - t0) * scale; }
    svg.setAttribute("data-t0", t0);
    svg.setAttribute("data-t1", t1);
    svg.setAttribute("data-x0", LEFT);
    svg.setAttribute("data-pw", pw);
    // The axis: about 8 ticks at a round step.
    var span = t1 - t0, step = Math.pow(10, Math.floor(Math.log10(span / 8)));
    [1, 2, 5, 10].some(function (m) { if (span / (step * m) <= 8) { step *= m; return true; } return false; });
    el("line", { x1: LEFT, x2: LEFT + pw, y1: TOP - 4, y2: TOP - 4, stroke: "#999" }, svg);
    for (var t = 0; t <= span; t += step) {
      el("line", { x1: x(t0 + t), x2: x(t0 + t), y1: TOP - 8, y2: height, stroke: "#eee" }, svg);
      el("text", { x: x(t0 + t), y: TOP - 10, "font-size": 10, "text-anchor": "middle" }, svg).textContent =
        (step >= 1000 ? (t / 1000).toFixed(step >= 10000 ? 0 : 1) + " s" : t.toFixed(0) + " ms");
    }
    // Newest on top.
    records.forEach(function (r, j) {
      var i = records.length - 1 - j;
      var y = TOP + i * ROW, a = r._arrive, v = verdict(r);
      var g = el("g", { "class": "strip", "data-id": r.id, "data-verdict": v, "data-row": i,
        "data-arrive-x": x(a).toFixed(2), "data-outcome": r.outcome, "data-tenant": r.tenant || "" }, svg);
      if (selected === r.id) g.classList.add("sel");
      el("text", { x: LEFT - 6, y: y + BAR - 2, "font-size": 10, "text-anchor": "end" }, g).textContent =
        (r.traffic === "canary" ? "canary " : "") + r.id + " " + r.outcome;
      el("rect", { "class": "bg", x: x(a), y: y, width: Math.max(end(r) * scale, 1), height: BAR, fill: FILL[v] }, g);
      el("line", { "class": "arrive", x1: x(a), x2: x(a), y1: y - 1, y2: y + BAR + 1, stroke: "#333", "stroke-width": 2 }, g);
      var tm = r.token_ms || [], per = r.tokens_per_event;
      // A slow first token: a band under the wait, with its cause.
      var fc = causeOf(r, "ttft", null);
      if (fc && r.ttft_ms !== null && r.ttft_ms !== undefined) {
        var sf = el("rect", causeAttrs({ "class": "slowfirst", x: x(a), y: y + BAR - 3, width: Math.max(r.ttft_ms * scale, 1), height: 3,
          fill: "#ff9800" }, fc), g);
        el("title", {}, sf).textContent = why(fc);
      }
      // Stalls: gaps between token events above the threshold, each
      // with its cause when attributed.
      for (var k = 1; k < tm.length; k++) {
        if (tm[k] - tm[k - 1] > threshold) {
          var sc = causeOf(r, "stall", tm[k - 1]);
          var st = el("rect", causeAttrs({ "class": "stall", x: x(a + tm[k - 1]), y: y + 1, width: Math.max((tm[k] - tm[k - 1]) * scale, 1), height: BAR - 2,
            fill: "#e53935", "fill-opacity": 0.55, "data-from-ms": tm[k - 1], "data-to-ms": tm[k] }, sc), g);
          if (sc) el("title", {}, st).textContent = why(sc);
        }
      }
      // Token events: one path of ticks; multi-token events taller.
      var one = "", multi = "";
      for (k = 0; k < tm.length; k++) {
        var px = x(a + tm[k]).toFixed(2);
        if (per && per[k] > 1) multi += "M" + px + " " + (y - 2) + "v" + (BAR + 4);
        else one += "M" + px + " " + (y + 2) + "v" + (BAR - 4);
      }
      if (one) el("path", { "class": "tokens", d: one, stroke: "#555", "stroke-width": 1 }, g);
      if (multi) el("path", { "class": "multi", d: multi, stroke: "#6a1b9a", "stroke-width": 2.5 }, g);
      if (r.ttft_ms !== null && r.ttft_ms !== undefined) {
        el("line", { "class": "first", x1: x(a + r.ttft_ms), x2: x(a + r.ttft_ms), y1: y - 1, y2: y + BAR + 1, stroke: "#1565c0", "stroke-width": 2.5 }, g);
      }
      if (r.terminal_ms !== null && r.terminal_ms !== undefined) {
        var tx = x(a + r.terminal_ms);
        el("line", { "class": "terminal", x1: tx, x2: tx, y1: y - 1, y2: y + BAR + 1, stroke: r.outcome === "success" ? "#000" : "#b00", "stroke-width": 3 }, g);
      }
      if (r.preemptions_during > 0) {
        el("text", { "class": "preempt", x: x(a + end(r)) + 4, y: y + BAR - 2, "font-size": 10, fill: "#e65100" }, g).textContent = "P" + r.preemptions_during;
      }
      el("title", {}, g).textContent = r.id + (r.tenant ? " (tenant " + r.tenant + ")" : "") + ": " + r.outcome + ", " + (r.output_tokens >= 0 ? r.output_tokens : "?") + " tokens, TTFT " + fmt(r.ttft_ms, 1) + " ms, " + (r.stalls || 0) + " stalls" +
        (r.causes || []).map(function (c) { return "\n" + why(c); }).join("");
      g.addEventListener("mouseenter", function () { if (selected === null) showRecord(r); });
      g.addEventListener("click", function () {
        selected = selected === r.id ? null : r.id;
        svg.querySelectorAll(".strip.sel").forEach(function (s) { s.classList.remove("sel"); });
        if (selected !== null) g.classList.add("sel");
        showRecord(r);
      });
    });
  }

  // showRecord lists the record's fields, whatever they are: the record
  // line is the source (docs/records.md), arrays shown by their length.
  function showRecord(r) {
    var t = document.getElementById("detail");
    clear(t);
    // Why it was slow first, each cause pointing to its request (whose
    // strip is outlined when shown).
    (r.causes || []).forEach(function (c) {
      var tr = html("tr", null, t, "why");
      html("td", "why", tr);
      html("td", why(c), tr);
    });
    markRefs(r);
    Object.keys(r).forEach(function (k) {
      if (k.charAt(0) === "_") return;
      var v = r[k], tr = html("tr", null, t);
      html("td", k, tr);
      var s;
      if (Array.isArray(v) && v.length > 0 && typeof v[0] === "number") s = v.length + " values, " + v.slice(0, 8).join(", ") + (v.length > 8 ? ", …" : "");
      else if (v !== null && typeof v === "object") s = JSON.stringify(v);
      else s = String(v);
      html("td", s, tr);
    });
  }

  // Trend charts: one small SVG per figure over the last 15 minutes.
  function chart(box, title, series, opts) {
    var w = 300, h = 90, ml = 40, mb = 14, mt = 4;
    var div = html("div", null, box, "chart");
    var last = series.map(function (s) {
      for (var i = s.pts.length - 1; i >= 0; i--) if (s.pts[i][1] !== null) return s.name + " " + fmt(s.pts[i][1], 3);
      return s.name + " –";
    });
    html("div", title + ": " + last.join(", "), div, "title");
    var svg = el("svg", { width: w, height: h, "data-title": title }, div);
    var now = Date.now(), from = now - 15 * 60 * 1000;
    var max = opts.max || 0;
    series.forEach(function (s) { s.pts.forEach(function (p) { if (p[1] !== null) max = Math.max(max, p[1]); }); });
    if (opts.target) max = Math.max(max, opts.target);
    if (max <= 0) max = 1;
    var min = opts.min || 0;
    function X(t) { return ml + (t - from) / (now - from) * (w - ml - 4); }
    function Y(v) { return mt + (1 - (v - min) / (max - min)) * (h - mt - mb); }
    el("rect", { x: ml, y: mt, width: w - ml - 4, height: h - mt - mb, fill: "none", stroke: "#ccc" }, svg);
    el("text", { x: ml - 3, y: mt + 8, "font-size": 9, "text-anchor": "end" }, svg).textContent = fmt(max, 2);
    el("text", { x: ml - 3, y: h - mb, "font-size": 9, "text-anchor": "end" }, svg).textContent = fmt(min, 2);
    el("text", { x: ml, y: h - 2, "font-size": 9 }, svg).textContent = "−15 min";
    el("text", { x: w - 4, y: h - 2, "font-size": 9, "text-anchor": "end" }, svg).textContent = "now";
    if (opts.target) el("line", { x1: ml, x2: w - 4, y1: Y(opts.target), y2: Y(opts.target), stroke: "#b00", "stroke-dasharray": "4,3" }, svg);
    series.forEach(function (s) {
      var d = "";
      s.pts.forEach(function (p) {
        if (p[1] === null || p[0] < from) return;
        d += (d ? "L" : "M") + X(p[0]).toFixed(1) + " " + Y(p[1]).toFixed(1);
      });
      if (d) el("path", { d: d, fill: "none", stroke: s.color, "stroke-width": 1.5, "class": "series" }, svg);
    });
  }

  function drawTrend(tr) {
    var box = document.getElementById("trend");
    clear(box);
    if (!tr) return;
    document.getElementById("resolution").textContent = "(one point per " + tr.resolution_seconds + " s, from the same finished records as /slo)";
    function pts(f) { return tr.points.map(function (p) { var v = f(p); return [Date.parse(p.start), v === undefined ? null : v]; }); }
    function ms(v) { return v === null ? null : v * 1000; }
    chart(box, "TTFT ms", [{ name: "p50", color: "#1565c0", pts: pts(function (p) { return ms(p.ttft_p50_seconds); }) },
      { name: "p99", color: "#b00", pts: pts(function (p) { return ms(p.ttft_p99_seconds); }) }], {});
    chart(box, "ITL p99 ms", [{ name: "p99", color: "#b00", pts: pts(function (p) { return ms(p.itl_p99_seconds); }) }], {});
    var colors = ["#2e7d32", "#6a1b9a", "#00838f", "#ef6c00"];
    tr.slos.forEach(function (o, i) {
      chart(box, "goodput tok/s, SLO " + o.name, [{ name: "goodput", color: colors[i % 4], pts: pts(function (p) { return p.slos[i].goodput_tokens_per_second; }) }], {});
      chart(box, "attainment, SLO " + o.name + " (target " + o.target + ")", [
        { name: "attainment", color: colors[i % 4], pts: pts(function (p) { return p.slos[i].attainment; }) },
        { name: "95% lower bound", color: "#999", pts: pts(function (p) { return p.slos[i].offered > 0 ? p.slos[i].attainment_lower95 : null; }) }],
        { min: 0, max: 1, target: o.target });
    });
    if (tr.slos.length === 0) html("div", "no SLO declared: no attainment or goodput (docs/slo.md)", box, "chart");
    chart(box, "in flight", [{ name: "requests", color: "#333", pts: pts(function (p) { return p.in_flight; }) }], {});
    chart(box, "engine queue", [{ name: "waiting", color: "#ef6c00", pts: pts(function (p) { return p.engine_queue; }) }], {});
  }

  function setSynthetic(s) {
    var b = document.getElementById("synthetic");
    b.hidden = !s;
    b.textContent = s ? "SYNTHETIC: " + s : "";
  }

  // setTenants offers the tenant labels of the records kept (tenants on)
  // in the filter, keeping the one chosen.
  function setTenants(list) {
    var sel = document.getElementById("tenant");
    sel.hidden = list.length === 0 && !tenant;
    if (list.indexOf(tenant) < 0 && tenant) list = list.concat([tenant]);
    var have = Array.prototype.map.call(sel.options, function (o) { return o.value; }).slice(1);
    if (have.join("\n") === list.join("\n")) return;
    while (sel.options.length > 1) sel.remove(1);
    list.forEach(function (t) { var o = html("option", t, sel); o.value = t; });
    sel.value = tenant;
  }

  var capacity = null;
  // load fetches /live/data once; with again, it polls on.
  function load(again) {
    var n = capacity === null ? wanted : Math.min(+wanted, capacity);
    var url = "/live/data?" + (seq === null ? "" : "since=" + seq + "&") + "n=" + encodeURIComponent(n) +
      (tenant ? "&tenant=" + encodeURIComponent(tenant) : "");
    fetch(url, { cache: "no-store" }).then(function (res) {
      if (!res.ok) throw new Error("/live/data: HTTP " + res.status);
      return res.json();
    }).then(function (d) {
      document.getElementById("status").textContent = "";
      document.getElementById("updated").textContent = new Date(d.generated).toLocaleTimeString();
      document.getElementById("capacity").textContent = d.capacity;
      capacity = d.capacity;
      threshold = d.stall_threshold_ms;
      document.getElementById("stall").textContent = threshold;
      setSynthetic(d.synthetic);
      setTenants(d.tenants || []);
      if (!d.unchanged) {
        records = d.records;
        seq = d.seq;
        drawStrips();
        if (selected !== null) records.forEach(function (r) { if (r.id === selected) showRecord(r); });
      }
      document.body.setAttribute("data-seq", d.seq);
      drawTrend(d.trend);
    }).catch(function (e) {
      document.getElementById("status").textContent = "(" + e.message + "; retrying)";
    }).then(function () { if (again) setTimeout(function () { load(true); }, POLL_MS); });
  }

  function pollCanary() {
    fetch("/probes?format=json", { cache: "no-store" }).then(function (res) {
      if (!res.ok) throw new Error("/probes: HTTP " + res.status);
      return res.json();
    }).then(function (d) {
      var t = document.getElementById("canary");
      clear(t);
      var probes = d.probes || [];
      if (probes.length === 0) { html("td", "no canary probe declared (docs/probe.md)", html("tr", null, t)); return; }
      var hr = html("tr", null, t);
      ["probe", "consecutive failures", "last results (newest first)"].forEach(function (h) { html("th", h, hr); });
      probes.forEach(function (p) {
        var tr = html("tr", null, t);
        html("td", p.name, tr);
        html("td", String(p.consecutive_failures), tr, p.consecutive_failures > 0 ? "bad" : "ok");
        var td = html("td", null, tr);
        (p.recent || []).slice(0, 10).forEach(function (r) {
          var ok = r.result === "success";
          html("span", (ok ? "✓" : "✗ " + (r.failed_check || r.result)) + (r.ttft_ms !== undefined && r.ttft_ms !== null ? " " + fmt(r.ttft_ms, 0) + " ms" : "") + "  ", td, ok ? "ok" : "bad");
        });
      });
    }).catch(function (e) {
      var t = document.getElementById("canary");
      clear(t);
      html("td", "canary results unavailable: " + e.message, html("tr", null, t));
    }).then(function () { setTimeout(pollCanary, CANARY_MS); });
  }

  var pick = document.getElementById("n");
  pick.value = wanted;
  pick.addEventListener("change", function () {
    wanted = pick.value;
    seq = null;
    history.replaceState(null, "", "?n=" + encodeURIComponent(wanted) + (tenant ? "&tenant=" + encodeURIComponent(tenant) : ""));
    load(false);
  });
  var tsel = document.getElementById("tenant");
  tsel.addEventListener("change", function () {
    tenant = tsel.value;
    seq = null;
    history.replaceState(null, "", "?n=" + encodeURIComponent(wanted) + (tenant ? "&tenant=" + encodeURIComponent(tenant) : ""));
    load(false);
  });
  window.addEventListener("resize", drawStrips);
  load(true);
  pollCanary();
})();
