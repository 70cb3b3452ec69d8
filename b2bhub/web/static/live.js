// Live updates from GET /api/v1/events (Server-Sent Events of history lines; the login
// session lets the page read it). No build step, no library.
//  - tbody[data-live-rows]: the rows of changed messages are fetched from that URL
//    (with ?ids=) and replace their old rows; new matching messages go on top.
//  - [data-live-section]: the section is fetched again from this page's URL and swapped
//    in, at most every 2 s; a number limits the stream to that message's lines;
//    data-live-every="N" also fetches it every N seconds (figures no event announces).
//  - tbody[data-live-logs]: log records from that stream URL go on top.
// The stream resumes after body[data-live-after], the last history id before the page
// read what it shows (b2bhub/web/__init__.py LIVE_PAGES).
// Without JavaScript every page still works; it is just not live.
(function () {
  "use strict";
  var TYPES = ["received", "status_changed", "delivery_changed", "not_routed",
    "redispatch_requested", "redeliver_requested", "send_again_requested",
    "cancel_requested", "resubmit_requested", "skip_requested", "stale_outcome_ignored",
    "duplicate_received", "comment", "alert_acknowledged", "config_changed",
    "ack_generated", "ack_failed"];
  var dot = document.getElementById("live-state");
  var logs = document.querySelector("tbody[data-live-logs]");
  if (logs) { tailLogs(logs); return; }
  var rows = document.querySelector("tbody[data-live-rows]");
  var section = document.querySelector("[data-live-section]");
  if (!rows && !section) { return; }
  if (section && section.dataset.liveEvery) {
    setInterval(function () { if (!sectionTimer) { refreshSection(); } },
      1000 * Number(section.dataset.liveEvery));
  }
  // Resume after the history id the page was rendered with (body[data-live-after]),
  // so a change committed between the render and the stream's start is not missed.
  // On a reconnect the browser sends Last-Event-ID, which the server prefers.
  var params = new URLSearchParams();
  if (section && /^\d+$/.test(section.dataset.liveSection)) {
    params.set("message", section.dataset.liveSection);
  }
  if (/^\d+$/.test(document.body.dataset.liveAfter || "")) {
    params.set("after", document.body.dataset.liveAfter);
  }
  var url = "/api/v1/events" + (params.toString() ? "?" + params.toString() : "");
  var source = new EventSource(url);
  source.onopen = function () { if (dot) { dot.classList.add("on"); } };
  source.onerror = function () { if (dot) { dot.classList.remove("on"); } };

  var changed = new Set();
  var rowTimer = null, sectionTimer = null, lastSection = 0;

  function onEvent(event) {
    var line;
    try { line = JSON.parse(event.data); } catch (err) { return; }
    if (rows && line.message_id) {
      changed.add(line.message_id);
      if (!rowTimer) { rowTimer = setTimeout(refreshRows, 250); }
    }
    if (section && !sectionTimer) {
      var wait = Math.max(250, 2000 - (Date.now() - lastSection));
      sectionTimer = setTimeout(refreshSection, wait);
    }
  }
  TYPES.forEach(function (type) { source.addEventListener(type, onEvent); });
  source.onmessage = onEvent;

  function refreshRows() {
    rowTimer = null;
    var ids = Array.from(changed).slice(0, 200);
    ids.forEach(function (id) { changed.delete(id); });
    if (changed.size) { rowTimer = setTimeout(refreshRows, 250); }
    var target = new URL(rows.dataset.liveRows, window.location.href);
    target.searchParams.set("ids", ids.join(","));
    fetch(target, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : ""; })
      .then(function (html) {
        var holder = document.createElement("template");
        holder.innerHTML = html;
        var fresh = Array.from(holder.content.querySelectorAll("tr[data-id]"));
        fresh.sort(function (a, b) { return a.dataset.id - b.dataset.id; });
        fresh.forEach(function (tr) {
          var old = rows.querySelector('tr[data-id="' + tr.dataset.id + '"]');
          tr.classList.add("fresh");
          if (tr.dataset.match === "0") { tr.classList.add("unmatched"); }
          if (old) {
            old.replaceWith(tr);
          } else if (tr.dataset.match === "1" && rows.dataset.liveInsert === "yes") {
            rows.insertBefore(tr, rows.firstChild);
          }
        });
        var empty = document.getElementById("no-messages");
        if (empty && rows.querySelector("tr[data-id]")) { empty.remove(); }
      })
      .catch(function () {});
  }

  function tailLogs(body) {
    var stream = new EventSource(body.dataset.liveLogs);
    stream.onopen = function () { if (dot) { dot.classList.add("on"); } };
    stream.onerror = function () { if (dot) { dot.classList.remove("on"); } };
    stream.addEventListener("log", function (event) {
      var r;
      try { r = JSON.parse(event.data); } catch (err) { return; }
      var tr = document.createElement("tr");
      tr.className = "lv-" + r.level + " fresh";
      [r.created_at.replace("T", " ").replace(/\.\d+/, "").replace("Z", ""), r.level,
        r.kind + " " + r.host + ":" + r.pid, r.logger, r.message].forEach(function (text) {
        var td = document.createElement("td");
        td.textContent = text;
        tr.appendChild(td);
      });
      var none = body.querySelector("tr.none");
      if (none) { none.remove(); }
      body.insertBefore(tr, body.firstChild);
      while (body.rows.length > 500) { body.deleteRow(-1); }
    });
  }

  function refreshSection() {
    sectionTimer = null;
    lastSection = Date.now();
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : ""; })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById(section.id);
        if (fresh) { section.replaceWith(fresh); section = fresh; }
      })
      .catch(function () {});
  }
})();
