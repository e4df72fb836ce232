// corral ui: live updates of the Runs page (server-sent events). Everything else
// works without this script. The rows arrive rendered and escaped by the server.
"use strict";
(function () {
  var live = document.getElementById("live");
  if (!live || !window.EventSource) { return; }
  var tbody = document.querySelector("#runs tbody");
  var total = document.getElementById("total");
  var chain = document.getElementById("chain");
  var source = new EventSource(live.dataset.events);
  live.textContent = "Connecting for live updates…";
  source.onopen = function () { live.textContent = "Live: new runs appear at the top."; };
  source.onerror = function () { live.textContent = "Live updates interrupted; retrying…"; };
  source.addEventListener("run", function (event) {
    var template = document.createElement("template");
    template.innerHTML = event.data.trim();
    var row = template.content.firstElementChild;
    if (!row || tbody.querySelector('tr[data-seq="' + row.dataset.seq + '"]')) { return; }
    row.classList.add("new");
    tbody.insertBefore(row, tbody.firstElementChild);
    total.textContent = String(Number(total.textContent) + 1);
  });
  source.addEventListener("chain", function (event) {
    var ok = event.data.indexOf("ok ") === 0;
    chain.className = "chain " + (ok ? "ok" : "broken");
    chain.querySelector("strong").textContent = ok ? "verified" : "BROKEN";
    chain.querySelector("span").textContent = event.data.slice(ok ? 3 : 7);
  });
})();
