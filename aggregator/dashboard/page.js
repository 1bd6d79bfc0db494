// The round dashboard: live (polls the aggregator's /v1/dashboard) or the final report (figures embedded).
(function () {
  "use strict";
  var reportNode = document.getElementById("report-data");
  var liveNode = document.getElementById("live-source");
  var data = null;
  var clockOffset = 0; // server seconds minus this browser's, so countdowns follow the aggregator's clock
  var PLOT = { displayModeBar: false, responsive: true };

  function figure(name, text) {
    document.querySelectorAll('[data-figure="' + name + '"]').forEach(function (node) { node.textContent = text; });
  }
  function localTime(t) {
    return new Date(t * 1000).toLocaleString(undefined, { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
  }
  function duration(seconds) {
    var s = Math.max(0, Math.round(seconds)), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    if (h) return h + " h " + m + " min";
    if (m) return m + " min " + r + " s";
    return r + " s";
  }
  function nowSeconds() { return reportNode ? data.now : Date.now() / 1000 + clockOffset; }
  function cell(row, text, cls) { var td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; row.appendChild(td); return td; }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  // plotly.js 3 and later take an axis title only as an object (a bare string draws no title).
  function axisTitle(text) { return { text: text }; }
  // Each cell names its column (data-label), so a narrow screen can show a row as a stack of labelled lines (page.css).
  function labelCells(table) {
    var heads = Array.prototype.map.call(table.querySelectorAll("thead th"), function (th) { return th.textContent; });
    table.querySelectorAll("tbody tr").forEach(function (row) {
      Array.prototype.forEach.call(row.children, function (td, i) { td.setAttribute("data-label", heads[i] || ""); });
    });
  }

  function renderSteps() {
    var now = nowSeconds(), body = document.querySelector("#steps tbody"), next = null;
    clear(body);
    data.steps.forEach(function (step) {
      var row = document.createElement("tr");
      var done = step.at <= now;
      if (!done && next === null) { next = step; row.className = "next"; } else if (done) { row.className = "done"; }
      cell(row, localTime(step.at)); cell(row, step.what); cell(row, step.explain);
      cell(row, done ? "done" : (step === next ? "in " + duration(step.at - now) : ""));
      body.appendChild(row);
    });
    labelCells(document.getElementById("steps"));
    var ended = data.phase === "done" || data.phase === "degraded" || data.phase === "failed";
    if (ended) {
      figure("next-what", data.phase === "done" ? "The round is over: the model and this report are published." :
        data.phase === "degraded" ? "The round is over, degraded: " + shortSurveys() + " got fewer reports than the round's minimum; the model and this report are published." :
        "The round failed: " + ((data.report || {}).reason || "see the report"));
      figure("countdown", "");
    } else if (next !== null) {
      figure("next-what", next.what[0].toUpperCase() + next.what.slice(1) + " at " + localTime(next.at));
      figure("countdown", "(in " + duration(next.at - now) + ")");
    } else {
      figure("next-what", "Delivery has closed: the aggregator is learning.");
      figure("countdown", "");
    }
  }

  function deadlineShapes() {
    return data.steps.filter(function (s) { return /closes/.test(s.what); }).map(function (s) {
      return { type: "line", xref: "x", yref: "paper", x0: new Date(s.at * 1000), x1: new Date(s.at * 1000), y0: 0, y1: 1, line: { dash: "dot", width: 1, color: "#9aa5b5" } };
    });
  }
  function line(name, points, dash) {
    return { name: name, type: "scatter", mode: "lines", line: { shape: "hv", dash: dash || "solid" },
             x: points.map(function (p) { return new Date(p[0] * 1000); }), y: points.map(function (p) { return p[1]; }) };
  }

  function renderParticipation() {
    var c = data.counts;
    figure("registered", c.registered || 0);
    figure("credentials", c.credentials || 0);
    figure("accepted", c.accepted || 0);
    figure("awaiting", c["awaiting-verification"] || 0);
    figure("min-participation", data.min_participation);
    var traces = [line("registered", data.series.registered), line("credentials", data.series.credentials, "dash")];
    Object.keys(data.series.accepted).sort().forEach(function (label) { traces.push(line("accepted · " + label, data.series.accepted[label])); });
    var any = traces.some(function (t) { return t.x.length > 0; });
    var node = document.getElementById("chart-participation");
    node.hidden = !any;
    if (any && window.Plotly) {
      Plotly.react(node, traces, { margin: { t: 10, r: 10, b: 40, l: 50 }, xaxis: { title: axisTitle("local time"), type: "date", automargin: true },
        yaxis: { title: axisTitle("count (cumulative)"), rangemode: "tozero", automargin: true },
        // Below the axis title, hanging down (a bottom-anchored legend grew up over the axis on a phone).
        legend: { orientation: "h", y: -0.3, yanchor: "top" }, shapes: deadlineShapes() }, PLOT);
    }
  }

  function renderRejections() {
    var reasons = Object.keys(data.rejected).sort(), total = reasons.reduce(function (a, r) { return a + data.rejected[r]; }, 0);
    figure("rejected-total", total);
    document.getElementById("rejected-words").textContent = total === 0 ? "packets rejected: none so far." : (total === 1 ? "packet rejected, by reason:" : "packets rejected, by reason:");
    var node = document.getElementById("chart-rejected");
    node.hidden = total === 0; // an empty chart says nothing: the sentence above does
    if (total > 0 && window.Plotly) {
      Plotly.react(node, [{ type: "bar", orientation: "h", y: reasons, x: reasons.map(function (r) { return data.rejected[r]; }), marker: { color: "#c0392b" } }],
        { margin: { t: 10, r: 10, b: 30, l: 10 }, xaxis: { title: axisTitle("packets"), rangemode: "tozero" }, yaxis: { automargin: true } }, PLOT);
    }
  }

  function renderRelays() {
    var body = document.querySelector("#relay-table tbody");
    clear(body);
    (data.relays || []).forEach(function (relay) {
      var row = document.createElement("tr");
      row.setAttribute("data-relay", relay.node_id);
      cell(row, relay.node_id.slice(0, 12) + "…"); cell(row, relay.address);
      cell(row, relay.status, relay.status === "ok" ? "status-ok" : (relay.checked_at ? "status-bad" : ""));
      cell(row, relay.round_trip_ms === null ? "–" : relay.round_trip_ms + " ms");
      cell(row, relay.checked_at ? localTime(relay.checked_at) : "–");
      body.appendChild(row);
    });
    labelCells(document.getElementById("relay-table"));
    document.getElementById("relays").hidden = !data.relays;
  }

  function renderPrivacy() {
    var list = document.getElementById("privacy-sentences"), warn = document.getElementById("privacy-warnings");
    clear(list); clear(warn);
    data.privacy.sentences.forEach(function (s) { var li = document.createElement("li"); li.textContent = s; list.appendChild(li); });
    data.privacy.warnings.forEach(function (s) { var li = document.createElement("li"); li.textContent = "Note: " + s; warn.appendChild(li); });
  }

  function shortSurveys() {
    var short = (data.report || {}).shortfall || {};
    var names = Object.keys(short).map(function (survey) { return survey + " (" + short[survey] + " accepted)"; });
    return names.length ? names.join(", ") : "some surveys";
  }

  function renderStatistics(answers) {
    var body = document.querySelector("#statistics-table tbody");
    clear(body);
    answers.forEach(function (a) {
      var row = document.createElement("tr");
      var shown = Array.isArray(a.estimate) ? a.estimate.map(function (v) { return v.toPrecision(4); }).join(", ") : a.estimate.toPrecision(4);
      cell(row, a.query); cell(row, a.subject); cell(row, shown); cell(row, a.std_error.toPrecision(3));
      cell(row, String(a.reports)); cell(row, a.formula, "explain");
      body.appendChild(row);
    });
    labelCells(document.getElementById("statistics-table"));
    document.getElementById("statistics-figures").hidden = false;
  }

  function renderModel() {
    var report = data.report, status = document.getElementById("model-status");
    var figures = document.getElementById("model-figures"), surveys = document.getElementById("survey-figures");
    if (!report) { status.textContent = "The model is trained when data delivery closes (" + localTime(data.steps[data.steps.length - 1].at) + ")."; return; }
    if (report.status === "failed") { status.textContent = "No model: the round failed (" + (report.reason || "see above") + ")."; return; }
    // An SGD round's model is its averaged coefficients, measured like the ensemble's.
    var utility = report.utility || (report.sgd && report.sgd.utility);
    if (report.statistics) {
      status.textContent = "A statistics round: " + report.statistics.length + " answers from " + (data.counts.accepted || 0) + " accepted reports, each beside its error.";
      renderStatistics(report.statistics);
    } else if (utility) {
      var averaged = report.averaged_model;
      status.textContent = (report.sgd ? "A " + (report.sgd.model || "logistic regression") + " by LDP gradient descent on the " +
        report.sgd.loss + " loss, " + report.sgd.steps + " steps (" + report.sgd.reports_per_step.join(", ") + " gradients each); trained on " :
        averaged && averaged.regularization_rule ? "An average of the peers' output-perturbed logistic regressions (λ rule " +
        averaged.regularization_rule.toPrecision(3) + ", categorical weight " + averaged.categorical_weight + "); trained on " : "Trained on ") +
        (data.counts.accepted || 0) + " accepted reports, measured on held-out data.";
      figures.hidden = false;
      figure("auc", utility.auc.toFixed(3));
      figure("test-rows", utility.rows);
      figure("test-file", utility.test_file);
      if (utility.roc && window.Plotly) {
        Plotly.react(document.getElementById("chart-roc"), [
          { name: "model", type: "scatter", mode: "lines", x: utility.roc.fpr, y: utility.roc.tpr, line: { width: 3 } },
          { name: "guessing", type: "scatter", mode: "lines", x: [0, 1], y: [0, 1], line: { dash: "dot", color: "#9aa5b5" } }],
          { margin: { t: 10, r: 10, b: 45, l: 55 }, xaxis: { title: axisTitle("false positive rate"), range: [0, 1] }, yaxis: { title: axisTitle("true positive rate"), range: [0, 1] } }, PLOT);
      }
    } else {
      status.textContent = report.model || report.sgd ? "The model is trained and published" + (report.sgd ? " (report.json: sgd.coefficients)" : "") + ". No held-out test file was given, so its quality is not measured: run `anonml aggregator run --test-file FILE` to measure AUC." : "No packet was accepted, so no model was trained.";
    }
    var bySurvey = report.accepted_by_survey || {};
    var names = Object.keys(bySurvey);
    if (names.length && window.Plotly) {
      surveys.hidden = false;
      Plotly.react(document.getElementById("chart-surveys"), [{ type: "bar", x: names, y: names.map(function (n) { return bySurvey[n]; }) }],
        { margin: { t: 10, r: 10, b: 20, l: 50 }, xaxis: { automargin: true }, yaxis: { title: axisTitle("accepted reports"), rangemode: "tozero", automargin: true } }, PLOT);
    }
  }

  function render() {
    figure("name", data.round.name);
    figure("round-id", data.round.id.slice(0, 16));
    figure("url", data.round.url);
    var phase = data.phase + (data.sub_round === null || data.sub_round === undefined ? "" : " " + data.sub_round);
    figure("phase", phase);
    document.querySelector(".phase").className = "phase " + data.phase;
    document.title = "AnonML round " + data.round.name + " · " + phase;
    document.getElementById("mode-note").textContent = reportNode ? "final report · figures as of " + localTime(data.now) : "live · updated " + localTime(data.now);
    renderSteps(); renderParticipation(); renderRejections(); renderRelays(); renderPrivacy(); renderModel();
    document.body.setAttribute("data-rendered-at", String(data.now));
  }

  function poll(source) {
    fetch(source.url, { cache: "no-store" }).then(function (r) { return r.json(); }).then(function (fresh) {
      data = fresh; clockOffset = fresh.now - Date.now() / 1000; render();
    }).catch(function () {
      document.getElementById("mode-note").textContent = "the aggregator does not answer (the round may be over); retrying";
    }).then(function () { setTimeout(function () { poll(source); }, source.every * 1000); });
  }

  if (reportNode) {
    data = JSON.parse(reportNode.textContent);
    render();
  } else {
    poll(JSON.parse(liveNode.textContent));
    setInterval(function () { if (data) renderSteps(); }, 1000);
  }
})();
