// The run page's stream panel: the run's durable stream (GET /streams/{run_id}, Server-Sent Events) as it arrives.
// EventSource reconnects by itself with Last-Event-ID, so a dropped connection continues after the last offset shown;
// a reload reads the stream again from its start. A gap record (the run's owner died mid-stream) is shown in place.
(function () {
  "use strict";
  var panel = document.getElementById("stream");
  if (!panel || !window.EventSource) { return; }
  var out = panel.querySelector(".stream-text");
  var status = panel.querySelector(".stream-status");
  var source = new EventSource(panel.getAttribute("data-src"));
  function add(cls, text, offset) {
    var span = document.createElement("span");
    span.className = cls;
    span.textContent = text;
    span.setAttribute("data-offset", offset);
    out.appendChild(span);
  }
  source.onopen = function () { status.textContent = "live"; };
  source.onerror = function () { status.textContent = "reconnecting…"; };
  source.addEventListener("chunk", function (e) {
    var r = JSON.parse(e.data);
    add("chunk epoch-" + r.epoch, typeof r.data === "string" ? r.data : JSON.stringify(r.data), r.offset);
  });
  source.addEventListener("end", function (e) {
    var r = JSON.parse(e.data);
    add("end", r.data && r.data.error ? " ⏹ ended: " + r.data.error + " " : " ⏹ ", r.offset);
  });
  source.addEventListener("gap", function (e) {
    var r = JSON.parse(e.data);
    add("gap", " ⋯ gap: epoch " + r.data.dead_epoch + " stopped here (its owner died); epoch " + r.epoch +
        " continues ⋯ ", r.offset);
  });
})();
