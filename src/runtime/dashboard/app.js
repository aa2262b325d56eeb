// linnet's dashboard: every rollout the agent's store holds, kept current by server-sent
// events from /api/events (a snapshot, then each change). Text is always set as text, never
// as markup: names and messages come from Git.
"use strict";

const rollouts = new Map();
const eventsOf = new Map(); // key -> the rollout's Kubernetes events, newest first
const historyOf = new Map(); // key -> its status file's commits on the status branch
let listed = false;
let fleet = null; // the fleet's view (with --fleet): /api/fleet, then "fleet" events
let source = null; // the source's state (/api/source's, by "source" events)
window.linnetUpdates = 0;

function key(r) { return r.short + "/" + r.namespace + "/" + r.name; }

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v; else el.setAttribute(k, v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const GOOD = ["Stable", "Completed"];
const BAD = ["RollingBack", "RolledBack", "Failed", "MigrationFailed"];
const WAITING = ["Paused", "AwaitingMigration"];

function tone(r) {
  const stalled = (r.status && r.status.conditions || []).some(c => c.type === "Stalled" && c.status === "True");
  if (!r.phase) return "none";
  if (BAD.includes(r.phase) || stalled) return "bad";
  if (GOOD.includes(r.phase)) return "ok";
  if (WAITING.includes(r.phase) || awaitsApproval(r)) return "wait";
  return "run";
}

// The approval a person gives in Git, per kind and strategy (src/inspect/approval.rs): what
// it does, the change, and how to stop instead; null when the rollout waits for nobody.
function awaitsApproval(r) { return !!r.approval; }

function badge(r) { return h("span", { class: "badge " + tone(r) }, r.phase || "no status"); }

function age(ts) {
  if (!ts) return "-";
  const s = Math.max(0, (Date.now() - Date.parse(ts)) / 1000);
  if (s < 120) return Math.round(s) + "s";
  if (s < 7200) return Math.round(s / 60) + "m";
  if (s < 172800) return Math.round(s / 3600) + "h";
  return Math.round(s / 86400) + "d";
}

function images(r) {
  if (r.canaryImage && r.canaryImage !== r.stableImage) return [r.stableImage || "?", " → ", h("b", {}, r.canaryImage)];
  return [r.stableImage || r.specImage];
}

function progress(r) {
  if (r.batch) return "batch " + r.batch;
  if (r.step !== null && r.step !== undefined && r.spec.steps) return "step " + (r.step + 1) + "/" + r.spec.steps.length;
  return "-";
}

function list() {
  const rows = [...rollouts.values()].sort((a, b) => key(a).localeCompare(key(b)));
  if (rows.length === 0) {
    return h("p", { class: "muted" }, listed ? "No rollouts yet: add a CanaryStatefulSet or CanaryDeployment to the Git repository." : "Waiting for the agent's first list of rollouts…");
  }
  return h("table", {},
    h("thead", {}, h("tr", {}, ["Rollout", "Kind", "Phase", "Progress", "Weight", "Images", "Ready", "Age", "What is happening"].map(t => h("th", {}, t)))),
    h("tbody", {}, rows.map(r => h("tr", { "data-rollout": key(r) },
      h("td", {}, h("a", { href: "#/" + key(r) }, r.namespace + "/" + r.name)),
      h("td", {}, r.kind),
      h("td", {}, badge(r)),
      h("td", {}, progress(r)),
      h("td", {}, r.weight === null || r.weight === undefined ? "-" : r.weight + "%"),
      h("td", {}, images(r)),
      h("td", {}, r.ready || "-"),
      h("td", {}, age(r.created)),
      h("td", { class: "msg" }, r.message || ""),
    ))));
}

// What to do next, in words a person who never read the docs can follow.
function next(r) {
  const stalled = (r.status && r.status.conditions || []).find(c => c.type === "Stalled" && c.status === "True");
  const t = tone(r);
  let title;
  if (stalled) title = "Stalled: nothing moves until Git changes";
  else if (awaitsApproval(r)) title = "Waiting for you: approve in Git";
  else if (t === "bad") title = "Rolled back or failed: fix it in Git";
  else if (t === "ok") title = "Settled: nothing to do";
  else title = "Working: linnet is moving it, nothing to do";
  let todo = null;
  const a = r.approval;
  if (a) todo = h("span", {}, "To " + a.what + ": " + a.how + " (the change: ", h("code", {}, JSON.stringify(a.change)), "); " + a.abort + ".");
  return h("div", { class: "next " + t }, h("b", {}, title), r.message || "", todo ? h("div", {}, todo) : null);
}

// A CanaryStatefulSet's replicas by ordinal, from its pods and claims as the API server has
// them (/api/rollouts/csts/…/replicas): each ordinal's stable and canary pod, and its volume
// between them, held by one set's claim or moving from one to the other.
const replicasOf = new Map(); // key -> the replica map, or {error}
const placeOf = new Map(); // key/ordinal/template -> {place, from, at}: where a volume was drawn
const SIDE_WORDS = { stable: "stable", canary: "canary", single: "its set" };

function podCard(r, p) {
  const version = p.canary ? "canary" : "stable";
  const state = p.deleting ? "going" : p.ready ? "ready" : "not ready";
  return h("div", { class: "pod " + version + (p.ready ? " ready" : " unready") + (p.deleting ? " deleting" : ""),
      "data-pod": p.name, "data-ready": String(p.ready), "data-restarts": String(p.restarts) },
    h("div", { class: "ord" }, p.name),
    h("div", {}, version + " · " + (p.image || (p.canary ? r.canaryImage : r.stableImage) || "?")),
    h("div", { class: "state" }, h("span", { class: "dot" }), state,
      " · " + p.restarts + (p.restarts === 1 ? " restart" : " restarts"),
      p.waiting ? " · " + p.waiting : null));
}

// Where a volume is drawn: under the set whose claim holds it, or between the two; and
// that place across the track (-1 the stable side, 0 the middle, 1 the canary side).
function placeOfVolume(v) {
  if (v.movingTo) return "moving-to-" + v.movingTo;
  return v.heldBy ? "at-" + v.heldBy : "unclaimed";
}
const ACROSS = { "at-stable": -1, "at-canary": 1 };
const SLIDE_MS = 1500;

function volumeChip(k, ordinal, v) {
  const place = placeOfVolume(v);
  const id = k + "/" + ordinal + "/" + v.template;
  const was = placeOf.get(id);
  const now = Date.now();
  let seen = was;
  if (!was || was.place !== place) {
    seen = { place, from: was ? was.place : null, at: was ? now : 0 };
    placeOf.set(id, seen);
  }
  // A change of place slides the volume from where it was; a render during the slide
  // carries it on.
  const sliding = seen.from && now - seen.at < SLIDE_MS;
  const offset = sliding ? ((ACROSS[seen.from] || 0) - (ACROSS[place] || 0)) * 9 : 0;
  const words = v.movingTo
    ? "moving to the " + SIDE_WORDS[v.movingTo] + (v.heldBy ? " (still on the " + SIDE_WORDS[v.heldBy] + "'s claim)" : "")
    : v.claim;
  return h("div", { class: "track " + place + (v.conflict ? " conflict" : "") },
    h("div", { class: "volume" + (sliding ? " sliding" : ""), "data-volume": v.volume, "data-held-by": v.heldBy || "",
        "data-moving-to": v.movingTo || "", "data-slid": sliding ? seen.from + ">" + place : null,
        style: sliding ? "--from: " + offset + "em; animation-delay: -" + (now - seen.at) + "ms" : null },
      h("b", {}, "⛁ " + v.volume), h("div", { class: "claim" }, v.template + ": " + words),
      v.conflict ? h("div", { class: "warn" }, "two volumes for this replica") : null));
}

function replicas(r) {
  if (r.kind !== "CanaryStatefulSet") return null;
  const k = key(r);
  const got = replicasOf.get(k);
  const title = h("h2", {}, "Replicas by ordinal");
  if (got === undefined) return [title, h("p", { class: "muted" }, "Loading…")];
  if (!got.replicas) return [title, h("p", { class: "muted" }, "Cannot read the pods: " + got.error)];
  const twoSets = !(r.spec.strategy && r.spec.strategy.type === "Partition");
  const head = h("div", { class: "map-row head" }, h("div", {}, "ordinal"),
    h("div", {}, twoSets ? r.name + "-stable" : "stable revision"),
    h("div", {}, "volume"), h("div", {}, twoSets ? r.name + "-canary" : "canary revision"));
  return [title, got.error ? h("p", { class: "muted" }, "Cannot read the pods now (" + got.error + "); as last read:") : null,
    got.truncated ? h("p", { class: "muted" }, "Over 1,000 pods or claims: the first 1,000 are shown.") : null,
    h("div", { class: "replica-map" }, head, got.replicas.map(row => {
      const lane = canary => {
        const pods = row.pods.filter(p => p.canary === canary).map(p => podCard(r, p));
        return pods.length || canary || row.pods.length ? pods : h("span", { class: "muted" }, "no pod");
      };
      return h("div", { class: "map-row", "data-ordinal": row.ordinal },
        h("div", { class: "ord" }, r.name + "-" + row.ordinal),
        h("div", { class: "lane stable" }, lane(false)),
        h("div", { class: "tracks" }, row.volumes.length ? row.volumes.map(v => volumeChip(k, row.ordinal, v)) : h("span", { class: "muted" }, "no volume")),
        h("div", { class: "lane canary" }, lane(true)));
    }))];
}

// Whether the map is in motion: a pod not ready or going, an ordinal with no pod or beyond
// the replicas (a handoff or a scale under way), or a volume between claims.
function unsettled(map, replicas) {
  return (map.replicas || []).some(row => row.pods.length === 0 || row.ordinal >= replicas ||
    row.pods.some(p => !p.ready || p.deleting) || row.volumes.some(v => v.movingTo || !v.heldBy));
}

// Read when the page opens and when the rollout changes; asked again while something moves
// (a restart does not change the rollout), only for the open page and while it is shown:
// every 3 s, then every 30 s once five answers in a row changed nothing (a pod that keeps
// crashing). An answer older than the newest asked is dropped.
let replicasTimer = null;
let replicasAsked = 0;
let replicasSame = 0;
async function loadReplicas(k) {
  if (!k.startsWith("csts/")) return;
  const asked = ++replicasAsked;
  let map;
  try {
    const r = await fetch("/api/rollouts/" + k + "/replicas");
    map = r.ok ? await r.json() : { error: await r.text() };
  } catch (e) {
    map = { error: String(e) };
  }
  if (asked !== replicasAsked || currentKey() !== k) return;
  const before = replicasOf.get(k);
  if (map.error && before && before.replicas) map = { error: map.error, replicas: before.replicas };
  replicasSame = before && JSON.stringify(before) === JSON.stringify(map) ? replicasSame + 1 : 0;
  replicasOf.set(k, map);
  render();
  clearTimeout(replicasTimer);
  const r = rollouts.get(k);
  if (map.error || unsettled(map, r ? r.spec.replicas : 0)) {
    replicasTimer = setTimeout(() => {
      if (currentKey() !== k) return;
      if (document.hidden) document.addEventListener("visibilitychange", () => loadReplicas(k), { once: true });
      else loadReplicas(k);
    }, replicasSame >= 5 ? 30000 : 3000);
  }
}

// A rollout's page opened: its map is read afresh, and its volumes slide only from then on.
function forgetReplicas(k) {
  replicasOf.delete(k);
  for (const id of [...placeOf.keys()]) if (id.startsWith(k + "/")) placeOf.delete(id);
  replicasSame = 0;
}

// A commit as a link to the Git host (--commit-link, or made from the repository address),
// else as text; only a commit id is put in the address.
function commitRef(r, sha) {
  const id = h("code", {}, sha);
  const ok = r.commitLink && /^https?:\/\//.test(r.commitLink) && /^[0-9a-f]{7,64}$/i.test(sha);
  return ok ? h("a", { href: r.commitLink.replace("{commit}", sha), rel: "noreferrer", class: "commit" }, id) : id;
}

// A CanaryStatefulSet's canary as it happened (status.stages): each step, the migration, the
// promotion or the rollback, with the move that opened it (and the commit then), when it
// started, how long it took and what ended it; then the steps still to come.
function stages(r) {
  const list = r.status && r.status.stages || [];
  if (list.length === 0) return null;
  const label = s => s.stage === "Step" ? "step " + s.step + " · " + s.canaryReplicas + " canary" : s.stage.toLowerCase();
  const rows = list.map(s => h("tr", { class: s.finishedAt ? (s.stage === "Rollback" ? "done bad" : "done") : "now",
      "data-stage": s.stage + (s.step ? " " + s.step : "") },
    h("td", {}, h("b", {}, label(s))),
    h("td", {}, h("div", {}, s.openedBy, s.commit ? [" at ", commitRef(r, s.commit)] : null),
      s.detail ? h("div", { class: "msg" }, s.detail) : null),
    h("td", {}, age(s.startedAt) + " ago"),
    h("td", {}, s.finishedAt ? took(s.startedAt, s.finishedAt) : "running " + took(s.startedAt, new Date().toISOString())),
    h("td", {}, s.closedBy || "")));
  const last = list[list.length - 1];
  const planned = r.spec.steps || [];
  if (last.stage === "Step" && !last.finishedAt) {
    for (let i = last.step; i < planned.length; i++) {
      rows.push(h("tr", { class: "pending", "data-stage": "Step " + (i + 1) },
        h("td", {}, h("b", {}, "step " + (i + 1) + " · " + planned[i] + " canary")), h("td", { class: "muted" }, "to come"), h("td", {}), h("td", {}), h("td", {})));
    }
  }
  return [h("h2", {}, "Timeline"), h("table", { class: "stages" },
    h("thead", {}, h("tr", {}, ["Stage", "Opened by", "Started", "Took", "Ended by"].map(t => h("th", {}, t)))),
    h("tbody", {}, rows))];
}

function steps(r) {
  if (r.kind === "CanaryStatefulSet" && r.status && (r.status.stages || []).length) return stages(r);
  if (r.kind === "CanaryStatefulSet" && r.spec.steps && r.spec.steps.length) {
    const now = r.step;
    return [h("h2", {}, "Steps"), h("ol", { class: "steps" }, r.spec.steps.map((count, i) =>
      h("li", { class: now === null || now === undefined ? "" : i < now ? "done" : i === now ? "now" : "" }, count + " canary"))) ];
  }
  const batches = r.status && r.status.batches;
  if (batches && batches.length) {
    // A blue-green rollout's two stages are its preview and its switch.
    const blueGreen = r.spec.strategy && r.spec.strategy.type === "BlueGreen";
    const label = b => blueGreen ? (b.batch === 1 ? "preview" : "switch") : "batch " + b.batch;
    return [h("h2", {}, blueGreen ? "Stages" : "Batches"), h("ol", { class: "steps timeline" }, batches.map(b =>
      h("li", { class: b.state === "Finished" ? "done" : b.state === "InProgress" ? "now" : "", "data-batch": b.batch, "data-state": b.state },
        h("b", {}, label(b)), " · " + b.target + " new · " + (b.state || ""),
        b.startedAt ? h("div", { class: "when" }, "started " + age(b.startedAt) + " ago" +
          (b.finishedAt ? ", took " + took(b.startedAt, b.finishedAt) : "")) : null)))];
  }
  return null;
}

// How long from `from` to `to` (timestamps), in the units `age` uses.
function took(from, to) {
  const s = Math.max(0, (Date.parse(to) - Date.parse(from)) / 1000);
  if (s < 120) return Math.round(s) + "s";
  if (s < 7200) return Math.round(s / 60) + "m";
  if (s < 172800) return Math.round(s / 3600) + "h";
  return Math.round(s / 86400) + "d";
}

// A small SVG chart: `lines` of [x, y] points (x in ms) as steps or as a line, with dashed
// `rules` (thresholds) and dots; every coordinate is computed here, no text from the API is
// put in it but through textContent.
const SVG = "http://www.w3.org/2000/svg";
function svgEl(tag, attrs) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
}
// A number for an axis label: three significant digits at most (0.001, 0.25, 1000).
function short(y) { return String(Number(y.toPrecision(3))); }

function chart({ lines, rules = [], dots = [], x0, x1, yMax, yMin = 0, unit = "", cls = "chart", span = true }) {
  const w = 420, hgt = 110, left = 34, bottom = 16, top = 6;
  const all = lines.flatMap(l => l.points.map(p => p[1])).concat(rules.map(r => r.y), dots.map(d => d[1]));
  const lo = Math.min(yMin, ...all);
  const top_ = Math.max(...all, lo);
  // A ratio (0.02 against 0.05) fills the chart as a count does: 10 % above the highest.
  const hi = yMax !== undefined ? yMax : top_ > lo ? top_ + (top_ - lo) * 0.1 : lo + 1;
  const X = x => left + (x1 === x0 ? 0 : (x - x0) / (x1 - x0) * (w - left - 4));
  const Y = y => top + (hi === lo ? 0 : (hi - y) / (hi - lo)) * (hgt - top - bottom);
  const svg = svgEl("svg", { class: cls, width: w, height: hgt, viewBox: "0 0 " + w + " " + hgt });
  svg.append(svgEl("line", { x1: left, y1: Y(lo), x2: w - 4, y2: Y(lo), stroke: "#dde3ea" }));
  for (const [y, anchor] of [[hi, "start"], [lo, "start"]]) {
    const t = svgEl("text", { x: 2, y: Y(y) + 4, "font-size": 10, fill: "#667485", "text-anchor": anchor });
    t.textContent = short(y) + unit;
    svg.append(t);
  }
  for (const r of rules) {
    svg.append(svgEl("line", { x1: left, y1: Y(r.y), x2: w - 4, y2: Y(r.y), stroke: "#cf222e", "stroke-dasharray": "4 3", class: "rule", "data-y": r.y }));
  }
  for (const l of lines) {
    if (l.points.length === 0) continue;
    let pts = [];
    l.points.forEach((p, i) => {
      if (l.steps && i > 0) pts.push([p[0], l.points[i - 1][1]]);
      pts.push(p);
    });
    if (l.steps) pts.push([x1, l.points[l.points.length - 1][1]]);
    svg.append(svgEl("polyline", { points: pts.map(p => X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1)).join(" "),
      fill: "none", stroke: l.color, "stroke-width": 2, class: "series", "data-series": l.name,
      "data-values": l.points.map(p => p[1]).join(",") }));
  }
  for (const d of dots) svg.append(svgEl("circle", { cx: X(d[0]), cy: Y(d[1]), r: 3, fill: d[2], class: "dot-" + d[3] }));
  if (span) {
    const shown = svgEl("text", { x: w - 4, y: hgt - 3, "font-size": 10, fill: "#667485", "text-anchor": "end" });
    shown.textContent = took(new Date(x0).toISOString(), new Date(x1).toISOString()) + " shown";
    svg.append(shown);
  }
  return svg;
}

const PALETTE = ["#0969da", "#1a7f37", "#9a6700", "#8250df", "#cf222e", "#57606a"];

// The traffic share and the ready pods per version over time (status.series: a point each time
// they changed), up to now while the rollout works.
function overTime(r) {
  const series = r.status && r.status.series || [];
  if (series.length === 0) return null;
  const t = p => Date.parse(p.at);
  const x0 = t(series[0]);
  const settled = ["ok", "bad"].includes(tone(r));
  const last = t(series[series.length - 1]);
  // The agent's clock may be ahead of the browser's: never end before the last point.
  const x1 = Math.max(settled ? last : Date.now(), last, x0 + 1000);
  const out = [h("h2", {}, "Over time")];
  const known = v => v !== undefined && v !== null;
  if (series.some(p => known(p.weight))) {
    // Points with no weight (routes not read then) are left out, not drawn as 0.
    const lines = [{ name: "canary", color: PALETTE[0], steps: true, points: series.filter(p => known(p.weight)).map(p => [t(p), p.weight]) }];
    if (series.some(p => known(p.baselineWeight))) lines.push({ name: "baseline", color: PALETTE[5], steps: true, points: series.filter(p => known(p.baselineWeight)).map(p => [t(p), p.baselineWeight]) });
    out.push(h("div", { class: "chart-box", "data-chart": "traffic" }, h("div", {}, "Traffic to the canary (%)"),
      chart({ lines, x0, x1, yMax: 100, unit: "%" }), legend(lines)));
  }
  const images = [...new Set(series.flatMap(p => (p.ready || []).map(x => x.image)))];
  const lines = images.map((image, i) => ({ name: image, color: PALETTE[i % PALETTE.length], steps: true,
    points: series.map(p => [t(p), ((p.ready || []).find(x => x.image === image) || { replicas: 0 }).replicas]) }));
  out.push(h("div", { class: "chart-box", "data-chart": "pods" }, h("div", {}, "Ready pods per version"),
    chart({ lines, x0, x1, yMax: Math.max(1, r.spec.replicas || 1, ...lines.flatMap(l => l.points.map(p => p[1]))) }), legend(lines)));
  return out;
}

function legend(lines) {
  return h("div", { class: "legend" }, lines.map(l => h("span", {}, h("i", { style: "background:" + l.color }), l.name)));
}

// The bounds a condition sets on `result` itself, to draw as rules: `result < 0.05`,
// `result >= 0.9 && result <= 1.1`; nothing for `result[0] < 5`, `len(result) > 2` or
// `result < 5 * 2`.
const BOUND = /(?:^|[^\w.\]])result\s*(?:<=|<|>=|>)\s*(-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s*(?=$|&&|\|\||\)|;)/gi;
function thresholds(condition) {
  return [...(condition || "").matchAll(BOUND)].map(m => Number(m[1])).filter(Number.isFinite);
}

// A metric's measurements against its threshold (dots red where one failed), or with a
// baseline the canary's samples beside the baseline's.
function metricChart(m) {
  const ms = (m.measurements || []).filter(x => Number.isFinite(Number(x.value)));
  const canary = (m.canarySamples || []).filter(v => Number.isFinite(v));
  const baseline = (m.baselineSamples || []).filter(v => Number.isFinite(v));
  if (canary.length || baseline.length) {
    const lines = [{ name: "canary", color: PALETTE[0], points: canary.map((v, i) => [i, v]) },
      { name: "baseline", color: PALETTE[5], points: baseline.map((v, i) => [i, v]) }];
    const n = Math.max(canary.length, baseline.length, 2) - 1;
    return h("div", { class: "chart-box", "data-chart": "samples" }, chart({ lines, x0: 0, x1: n, yMin: Math.min(0, ...canary, ...baseline), cls: "chart spark", span: false }), legend(lines));
  }
  if (ms.length === 0) return h("span", { class: "muted" }, "no values");
  const points = ms.map(x => [Date.parse(x.at), Number(x.value)]);
  const rules = thresholds(m.condition).map(y => ({ y }));
  const dots = ms.map((x, i) => [points[i][0], points[i][1], x.phase === "Failed" ? "#cf222e" : "#0969da", x.phase === "Failed" ? "failed" : "ok"]);
  const x0 = points[0][0], x1 = Math.max(points[points.length - 1][0], x0 + 1000);
  return chart({ lines: [{ name: m.name, color: PALETTE[0], points }], rules, dots, x0, x1, yMin: Math.min(0, ...points.map(p => p[1])), cls: "chart spark" });
}

function analysis(r) {
  const runs = r.status && r.status.analysis || [];
  if (runs.length === 0) return null;
  return [h("h2", {}, "Analysis"), runs.map(run => h("div", { class: "run" },
    h("b", {}, run.name), " ", h("span", { class: "badge " + (run.phase === "Successful" ? "ok" : run.phase === "Running" ? "run" : "bad") }, run.phase),
    run.message ? h("div", { class: "muted" }, run.message) : null,
    (run.metrics || []).map(m => {
      const values = (m.measurements || []).map(x => Number(x.value)).filter(v => Number.isFinite(v));
      return h("div", { class: "metric" }, h("span", {}, m.name), metricChart(m),
        h("span", { class: "muted" }, (m.successful || 0) + " passed, " + (m.failed || 0) + " failed" + (values.length ? ", last " + values[values.length - 1] : "")),
        evidence(m));
    })))];
}

// What decides a metric and what it measures (issue 75): the judge's evidence against the
// baseline, the condition, the query, and its graph (a link only to http or https).
function evidence(m) {
  const graph = m.graph && /^https?:\/\//.test(m.graph) ? h("a", { href: m.graph, rel: "noreferrer" }, "graph") : null;
  return h("div", { class: "evidence muted" },
    m.comparison ? h("div", {}, m.comparison) : null,
    m.condition ? h("div", {}, m.condition) : null,
    m.query ? h("div", {}, h("code", {}, m.query), graph ? " " : null, graph) : null);
}

function conditions(r) {
  const cs = r.status && r.status.conditions || [];
  if (cs.length === 0) return null;
  return [h("h2", {}, "Conditions"), h("table", {}, h("tbody", {}, cs.map(c =>
    h("tr", {}, h("td", {}, c.type), h("td", {}, c.status), h("td", {}, c.reason), h("td", { class: "msg" }, c.message)))))];
}

// A rollout's events, read when its page opens and when it changes (never on a timer).
let eventsTimer = null;
function loadEvents(k) {
  clearTimeout(eventsTimer);
  eventsTimer = setTimeout(async () => {
    for (const [what, into] of [["events", eventsOf], ["history", historyOf]]) {
      try {
        const r = await fetch("/api/rollouts/" + k + "/" + what);
        into.set(k, r.ok ? await r.json() : { error: await r.text() });
      } catch (e) {
        into.set(k, { error: String(e) });
      }
    }
    if (currentKey() === k) render();
    loadReplicas(k);
  }, 300);
}

function events(k) {
  const list = eventsOf.get(k);
  if (list === undefined) return [h("h2", {}, "Events"), h("p", { class: "muted" }, "Loading…")];
  if (list.error) return [h("h2", {}, "Events"), h("p", { class: "muted" }, "Cannot read the events: " + list.error)];
  if (list.length === 0) return [h("h2", {}, "Events"), h("p", { class: "muted" }, "None yet.")];
  return [h("h2", {}, "Events"), h("table", { class: "events" }, h("tbody", {}, list.map(e =>
    h("tr", {}, h("td", {}, age(e.time) + " ago"), h("td", {}, e.type), h("td", {}, e.reason),
      h("td", { class: "msg" }, linked(e.note || ""), e.count > 1 ? " (×" + e.count + ")" : "")))))];
}

// http(s) addresses in a message as links (the pull requests linnet opened, in its events);
// the rest stays text.
const URL_IN_TEXT = /https?:\/\/[^\s"'<>]+/g;
// An address as found in text, without the punctuation that ends the sentence around it.
function trimmed(url) { return url.replace(/[.,;:!?\])]+$/, ""); }
function linked(text) {
  const out = [];
  let last = 0;
  for (const m of text.matchAll(URL_IN_TEXT)) {
    const url = trimmed(m[0]);
    out.push(text.slice(last, m.index), h("a", { href: url, rel: "noreferrer" }, url));
    last = m.index + url.length;
  }
  out.push(text.slice(last));
  return out;
}

// The pull requests linnet opened for a rollout, the newest of each kind, from its events
// (linnet's own: anyone who may create events could post one with the same reason).
const PULL_REQUESTS = {
  RevertPullRequestOpened: "Revert pull request",
  PromotionPullRequestOpened: "Promotion pull request",
  PromotionPullRequestMerged: "Promotion merged",
};
function pullRequests(k) {
  const list = eventsOf.get(k);
  if (!Array.isArray(list)) return [];
  const shown = new Set();
  const out = [];
  for (const e of list) {
    const label = e.controller === "linnet" && PULL_REQUESTS[e.reason];
    const url = label && !shown.has(e.reason) && (e.note || "").match(URL_IN_TEXT);
    if (!url) continue;
    shown.add(e.reason);
    out.push(h("dt", {}, label), h("dd", {},
      h("a", { href: trimmed(url[0]), rel: "noreferrer", class: "pull-request" }, trimmed(url[0])),
      " (" + age(e.time) + " ago)"));
  }
  return out;
}

function history(k) {
  const hist = historyOf.get(k);
  const title = h2("History in Git (status branch)");
  if (hist === undefined) return [title, h("p", { class: "muted" }, "Loading…")];
  if (hist.error) return [title, h("p", { class: "muted" }, "Cannot read it: " + hist.error)];
  if (hist.off) return [title, h("p", { class: "muted" }, hist.off)];
  if (hist.history.length === 0) return [title, h("p", { class: "muted" }, "No status commit yet.")];
  return [title, h("table", { class: "history" }, h("tbody", {}, hist.history.map(c =>
    h("tr", {}, h("td", {}, age(c.time) + " ago"), h("td", {}, commitRef(rollouts.get(k) || {}, c.commit)),
      h("td", {}, c.phase || ""), h("td", { class: "msg" }, c.summary)))))];
}

function h2(text) { return h("h2", {}, text); }

// Sign-in and actions (--dashboard-actions). A click asks the agent for a pull request in Git,
// authored as the signed-in person; the page never changes the cluster. The session is an
// HttpOnly cookie; each request that changes something carries its CSRF token.
let session = { actions: false, user: null, csrf: null };
let sessionError = null;
const actionResult = new Map(); // key -> {action, pending} | the agent's answer | {error}
const ACTION_WORDS = { promote: "Promote", advance: "Start the next batch", abort: "Abort" };

function loadSession() {
  fetch("/api/session").then(r => r.json()).then(s => { session = s; renderSession(); render(); }).catch(() => {});
}

function renderSession() {
  const el = document.getElementById("session");
  if (!session.actions) { el.replaceChildren(); return; }
  if (session.user) {
    const out = h("button", { type: "button", id: "sign-out" }, "Sign out");
    out.onclick = signOut;
    el.replaceChildren("Signed in as ", h("b", { id: "user" }, session.user.username), " ", out);
    return;
  }
  const input = h("input", { type: "password", id: "token", placeholder: "kubectl create token …", autocomplete: "off" });
  const form = h("form", { id: "sign-in" }, input, h("button", { type: "submit" }, "Sign in"),
    sessionError ? h("span", { class: "action-result error", id: "sign-in-error" }, sessionError) : null);
  form.onsubmit = e => { e.preventDefault(); signIn(input.value); };
  el.replaceChildren(form);
}

async function signIn(token) {
  const res = await fetch("/api/session", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ token }) });
  const body = await res.json().catch(() => ({}));
  sessionError = res.ok ? null : (body.error || "sign-in failed (" + res.status + ")");
  if (res.ok) session = { actions: true, merge: body.merge, user: body.user, csrf: body.csrf };
  renderSession();
  render();
}

async function signOut() {
  await fetch("/api/session", { method: "DELETE", headers: { "x-linnet-csrf": session.csrf || "" } }).catch(() => {});
  session = { actions: true, user: null, csrf: null };
  renderSession();
  render();
}

async function act(k, action) {
  actionResult.set(k, { action, pending: true });
  render();
  try {
    const res = await fetch("/api/rollouts/" + k + "/actions/" + action, { method: "POST", headers: { "x-linnet-csrf": session.csrf || "" } });
    const body = await res.json().catch(() => ({}));
    actionResult.set(k, res.ok ? Object.assign({ action }, body) : { action, status: res.status, error: body.error || "refused (" + res.status + ")" });
    if (res.status === 401) { session.user = null; renderSession(); }
  } catch (e) {
    actionResult.set(k, { action, error: String(e) });
  }
  render();
}

function actionOutcome(done) {
  if (!done) return null;
  if (done.pending) return h("span", { class: "action-result" }, "Asking Git to " + done.action + "…");
  if (done.error) return h("span", { class: "action-result error" }, done.error);
  if (!done.pullRequest) return h("span", { class: "action-result" }, "Git asks for this already: nothing to open.");
  const words = { opened: "Opened", found: "Already open:", merged: "Merged" }[done.state] || done.state;
  return h("span", { class: "action-result", "data-state": done.state }, words + " ",
    h("a", { href: done.pullRequest, rel: "noopener", id: "action-pr" }, done.pullRequest),
    done.state === "merged" ? "; the rollout follows at the next sync." : "; merge it to " + done.action + ".");
}

// The buttons that apply to this rollout now, as the agent says (its kind, strategy, phase).
function actionsPanel(r) {
  if (!session.actions || !(r.actions || []).length) return null;
  const k = key(r);
  const busy = (actionResult.get(k) || {}).pending;
  const buttons = r.actions.map(a => {
    const b = h("button", { type: "button", "data-action": a, disabled: !session.user || busy }, ACTION_WORDS[a] || a);
    b.onclick = () => act(k, a);
    return b;
  });
  const hint = session.user ? "Each opens a pull request in Git, authored as you" + (session.merge ? " (merged at once if you may merge this rollout)." : ".")
    : "Sign in to act: each opens a pull request in Git, authored as you.";
  return h("div", { class: "actions" }, buttons, h("span", { class: "muted" }, hint), actionOutcome(actionResult.get(k)));
}

function currentKey() { return location.hash.replace(/^#\/?/, ""); }

function detail(k) {
  const r = rollouts.get(k);
  if (!r) return h("p", {}, listed ? "No rollout " + k + " (deleted, or not this agent's). " : "Loading… ", h("a", { href: "#/" }, "All rollouts"));
  return h("section", { "data-rollout": k },
    h("p", {}, h("a", { href: "#/" }, "← All rollouts")),
    h("h1", {}, r.namespace + "/" + r.name, " ", badge(r)),
    next(r),
    actionsPanel(r),
    h("dl", { class: "facts" },
      h("dt", {}, "Kind"), h("dd", {}, r.kind + " (" + (r.spec.strategy && r.spec.strategy.type || "default") + ")"),
      h("dt", {}, "Images"), h("dd", {}, images(r)),
      h("dt", {}, "Serving"), h("dd", {}, r.serving || "-"),
      h("dt", {}, "Ready"), h("dd", {}, r.ready || "-"),
      h("dt", {}, "Traffic"), h("dd", {}, r.traffic || "no traffic routing"),
      h("dt", {}, "In this phase for"), h("dd", {}, age(r.phaseSince)),
      h("dt", {}, "Git commit"), h("dd", {}, r.revision ? commitRef(r, r.revision) : "-"),
      h("dt", {}, "Trace"), h("dd", {}, trace(r)),
      pullRequests(k),
      h("dt", {}, "Age"), h("dd", {}, age(r.created))),
    steps(r), replicas(r), overTime(r), analysis(r), conditions(r), events(k), history(k));
}

// The push's trace (with --otlp-endpoint), linked when --trace-link names the tracing UI.
function trace(r) {
  if (!r.traceId) return "-";
  const id = h("code", {}, r.traceId);
  return r.traceUrl ? h("a", { href: r.traceUrl, rel: "noopener" }, id) : id;
}

// Where each wave and cluster stands for each rollout of the fleet, from this agent's last
// read of Git (the other clusters' status files), as `linnet fleet status` shows it.
function fleetSummary() {
  if (!fleet || !fleet.fleet) return null;
  return h("p", { class: "fleet-summary" }, "Fleet ", h("b", {}, fleet.fleet), ": ",
    fleet.clusters.length + " cluster(s) reporting. ", h("a", { href: "#/fleet" }, "Waves and clusters →"));
}

function fleetTone(state) {
  if (state === "done") return "ok";
  if (state.startsWith("failed")) return "bad";
  if (state.startsWith("held") || state.startsWith("baking")) return "wait";
  return "run";
}

function fleetPage() {
  const back = h("p", {}, h("a", { href: "#/" }, "← All rollouts"));
  if (!fleet || fleet.reading) return h("section", {}, back, h("p", { class: "muted" }, "Reading the fleet from Git…"));
  if (!fleet.fleet) return h("section", {}, back, h("p", { class: "muted" }, "This agent is in no fleet (--fleet)."));
  if (fleet.problem) return h("section", {}, back, h("div", { class: "next bad" }, h("b", {}, "The Fleet cannot be read: every new image waits"), fleet.problem));
  return h("section", { "data-fleet": fleet.fleet }, back,
    h("h1", {}, "Fleet " + fleet.fleet),
    h("p", { class: "muted" }, "From Git: the Fleet and every cluster's status files (" + fleet.clusters.join(", ") + "). Each cluster's agent decides from the same."),
    fleet.rollouts.length === 0 ? h("p", { class: "muted" }, "No cluster has reported a rollout yet.") : null,
    fleet.rollouts.map(r => [
      h2(r.namespace + "/" + r.name + " (" + r.kind + "): " + (r.image || "no image reported")),
      h("table", { class: "fleet" },
        h("thead", {}, h("tr", {}, ["Wave", "Cluster", "Phase", "Stable", "Canary", "State"].map(t => h("th", {}, t)))),
        h("tbody", {}, r.clusters.map(c => h("tr", { "data-cluster": c.cluster },
          h("td", {}, c.wave), h("td", {}, c.cluster), h("td", {}, c.phase),
          h("td", {}, c.stable), h("td", {}, c.canary),
          h("td", {}, h("span", { class: "badge " + fleetTone(c.state) }, c.state.split(":")[0]),
            c.state.includes(":") ? h("span", { class: "msg" }, " " + c.state.slice(c.state.indexOf(":") + 1)) : null)))))]));
}

// The source this agent syncs: the revision, when, and what in it is not applied (each spec
// error and refused object located in its file), from its "source" events.
const SHOWN_ERRORS = 20;
function sourcePanel() {
  if (!source) return null;
  const degraded = (source.conditions || []).find(c => c.type === "Degraded" && c.status === "True");
  const problems = (source.specErrors || []).concat(source.syncErrors || []);
  const count = (source.specErrorCount || 0) + (source.syncErrorCount || 0);
  const t = source.lastError || degraded ? "bad" : "ok";
  return h("div", { class: "source next " + t, "data-source": source.source },
    h("b", {}, "Source " + source.source + ": " + (source.lastError ? "cannot sync" : degraded ? "part of it is not applied" : source.revision ? "synced" : "not synced yet")),
    h("div", {}, source.revision ? ["revision ", commitRef({ commitLink: source.commitLink }, source.revision)] : null,
      source.lastSync ? ", " + age(source.lastSync) + " ago" : null, ", " + (source.objects || 0) + " objects"),
    source.lastError ? h("div", { class: "msg" }, source.lastError) : null,
    problems.length ? h("ul", { class: "problems" }, problems.slice(0, SHOWN_ERRORS).map(e => h("li", {}, h("code", {}, e)))) : null,
    count > Math.min(problems.length, SHOWN_ERRORS) ? h("div", { class: "muted" }, "and " + (count - Math.min(problems.length, SHOWN_ERRORS)) + " more (linnet status lists them)") : null);
}

function render() {
  const route = currentKey();
  const main = document.getElementById("main");
  if (route === "fleet") main.replaceChildren(fleetPage());
  else main.replaceChildren(route ? detail(route) : h("div", {}, sourcePanel(), fleetSummary(), list()));
  document.title = route ? route + " · linnet" : "linnet";
}

function live(on, text) {
  const el = document.getElementById("live");
  el.className = "live " + (on ? "on" : "off");
  el.textContent = text;
}

function connect() {
  const events = new EventSource("/api/events");
  events.addEventListener("snapshot", e => {
    const d = JSON.parse(e.data);
    rollouts.clear();
    for (const r of d.rollouts) rollouts.set(key(r), r);
    listed = d.listed;
    window.linnetUpdates++;
    live(true, "live");
    render();
  });
  events.addEventListener("rollout", e => {
    const r = JSON.parse(e.data);
    rollouts.set(key(r), r);
    if (currentKey() === key(r)) loadEvents(key(r));
    window.linnetUpdates++;
    live(true, "live · updated " + new Date().toLocaleTimeString());
    render();
  });
  events.addEventListener("deleted", e => {
    rollouts.delete(key(JSON.parse(e.data)));
    window.linnetUpdates++;
    render();
  });
  events.addEventListener("source", e => {
    source = JSON.parse(e.data);
    window.linnetUpdates++;
    if (!currentKey()) render();
  });
  events.addEventListener("fleet", e => {
    fleet = JSON.parse(e.data);
    window.linnetUpdates++;
    render();
  });
  // EventSource reconnects by itself; the next snapshot replaces everything.
  events.onerror = () => live(false, "reconnecting…");
}

// A wave's bake ends with no new read of Git: the fleet's view is asked again as time passes.
function loadFleet() {
  fetch("/api/fleet").then(r => r.json()).then(f => { fleet = f; render(); }).catch(() => {});
}

window.addEventListener("hashchange", () => {
  if (currentKey() === "fleet") loadFleet();
  else if (currentKey()) {
    forgetReplicas(currentKey());
    loadEvents(currentKey());
  }
  render();
});
if (currentKey() && currentKey() !== "fleet") loadEvents(currentKey());
setInterval(() => { if (fleet && fleet.fleet) loadFleet(); else render(); }, 30000); // ages and bakes; the data comes by events
loadSession();
connect();
