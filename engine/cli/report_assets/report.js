// sopctl report: a click on a timeline bar opens that action run's details and scrolls to it.
(function () {
  "use strict";
  function focusRun(index) {
    var target = document.getElementById("run-" + index);
    if (!target) { return; }
    target.open = true;
    document.querySelectorAll(".run.focus").forEach(function (el) { el.classList.remove("focus"); });
    target.classList.add("focus");
    target.scrollIntoView({ block: "center" });
  }
  document.querySelectorAll("svg .bar[data-run]").forEach(function (bar) {
    bar.addEventListener("click", function () { focusRun(bar.getAttribute("data-run")); });
  });
  var toggle = document.getElementById("toggle-prompts");
  if (toggle) {
    toggle.addEventListener("click", function () {
      var boxes = document.querySelectorAll("details.prompt");
      var open = !Array.prototype.every.call(boxes, function (d) { return d.open; });
      boxes.forEach(function (d) { d.open = open; });
    });
  }
})();
