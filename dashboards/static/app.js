// quire live dashboard: polls /api/state every 2 s and renders it. No framework, no build.
"use strict";

const REFRESH_MS = 2000;
let lastState = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "title") node.title = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function setText(id, value) {
  document.getElementById(id).textContent = value;
}

function bytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n, i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? String(v) : v.toFixed(1)) + " " + units[i];
}

function labelText(labels) {
  return Object.entries(labels).map(([k, vs]) => vs.map(v => v ? `${k}=${v}` : k).join(" ")).join(" ");
}

function renderBrokers(brokers) {
  const box = document.getElementById("brokers");
  box.replaceChildren();
  setText("broker-count", brokers.length);
  if (!brokers.length) { box.append(el("p", { class: "empty" }, "no brokers")); return; }
  for (const b of brokers) {
    const tags = [];
    if (b.leader) tags.push(el("span", { class: "tag leader", title: "runs the allocator" }, "leader"));
    if (b.exiting) tags.push(el("span", { class: "tag warn" }, "exiting"));
    if (b.health) tags.push(el("span", { class: "tag warn", title: b.health }, "spool " + b.health.split(":")[0]));
    if (!b.in_etcd) tags.push(el("span", { class: "tag bad", title: "not a member in etcd" }, "no lease"));
    if (!b.reported) tags.push(el("span", { class: "tag warn", title: "not in the coordinators' broker list" }, "unreported"));
    const load = b.journal_limit ? Math.min(100, 100 * b.journals / b.journal_limit) : 0;
    box.append(el("article", { class: "card broker", "data-id": b.id },
      el("h3", {}, b.id, ...tags),
      el("div", { class: "endpoint" }, b.endpoint || "—"),
      el("div", { class: "stats" },
        el("span", {}, el("b", {}, b.journals), " journals"),
        el("span", {}, el("b", {}, b.primaries), " primaries"),
        el("span", {}, "limit ", el("b", {}, b.journal_limit))),
      el("div", { class: "bar", title: `${b.journals} / ${b.journal_limit}` },
        el("div", { style: `width:${load.toFixed(1)}%` }))));
  }
}

function journalRow(j) {
  const route = el("td", { class: "route" });
  j.route.forEach((m, i) => {
    route.append(el("span", { class: "member" + (m === j.primary ? " primary" : ""), title: j.endpoints[i] || "" },
      (m === j.primary ? "★ " : "") + m));
  });
  if (!j.route.length) route.append(el("span", { class: "muted" }, "—"));
  const notes = [];
  if (j.suspend !== "none") notes.push(`suspended (${j.suspend})`);
  if (j.flags !== "rw") notes.push(`flags ${j.flags}`);
  if (!j.listed_by_coordinators) notes.push("not listed by coordinators");
  return el("tr", { "data-journal": j.name },
    el("td", { class: "name" }, j.name, notes.length ? el("div", { class: "muted small" }, notes.join(" · ")) : null),
    el("td", { class: "labels" }, labelText(j.labels)),
    route,
    el("td", { class: "endpoint" }, j.primary_endpoint || "—"),
    el("td", { class: "num", title: j.write_head === null ? "unknown" : `${j.write_head} bytes` },
      j.write_head === null ? "—" : bytes(j.write_head)),
    storageCell(j.storage),
    watermarkCell(j.watermark),
    backlogCell(j.backlog, j.persist_failure),
    el("td", {}, el("span", { class: "state " + j.consistency }, j.consistency),
      el("span", { class: "muted small" }, ` ${j.route.length}/${j.replication}`)));
}

// What the index workers last counted in the journal's stores (null without Redis).
function storageCell(s) {
  if (!s) return el("td", { class: "num muted", title: "no storage stats (no Redis, or not yet refreshed)" }, "—");
  const oldest = s.oldest ? new Date(s.oldest * 1000).toISOString().replace(".000Z", "Z") : "—";
  return el("td", { class: "num storage", title: `${s.stored_bytes} bytes stored · offsets ${s.begin}–${s.end} · oldest ${oldest}` },
    bytes(s.stored_bytes), el("div", { class: "muted small" }, `${s.fragments} fragment${s.fragments === 1 ? "" : "s"}`));
}

function isoTime(t) {
  return t ? new Date(t * 1000).toISOString().replace(/\.\d{3}Z$/, "Z") : "—";
}

// Bytes acknowledged but not yet in the store, the age of the oldest, and the last persist
// failure with its reason (docs/operations.md, "Persistence backlog").
function backlogCell(b, f) {
  const fail = f ? el("div", { class: "state failed small", title: `${f.message} · store ${f.store}` },
    `${f.reason} ×${f.count}`) : null;
  if (!b) return el("td", { class: "num muted", title: "no backlog figures (no Redis)" }, "—", fail);
  if (!b.bytes) return el("td", { class: "num", title: "everything acknowledged is in the store" }, "0", fail);
  return el("td", { class: "num backlog", title: `${b.bytes} bytes not yet in the store · ${b.fragments} closed fragment(s) pending` },
    bytes(b.bytes), el("div", { class: "muted small" }, `oldest ${b.age.toFixed(0)}s`), fail);
}

// The persisted watermark (docs/jobs.md): everything acknowledged before it is in the store.
function watermarkCell(w) {
  if (w === null || w === undefined || !w)
    return el("td", { class: "num muted", title: "no persisted watermark (no Redis, or no pulse mark persisted yet)" }, "—");
  const behind = Math.max(0, Date.now() / 1000 - w);
  return el("td", { class: "num watermark", title: `persisted watermark ${isoTime(w)}` },
    isoTime(w).slice(11), el("div", { class: "muted small" }, `${behind.toFixed(0)}s behind`));
}

function renderJournals(journals) {
  const needle = document.getElementById("filter").value.trim().toLowerCase();
  const body = document.querySelector("#journals tbody");
  const shown = journals.filter(j => !needle ||
    [j.name, labelText(j.labels), j.route.join(" ")].join(" ").toLowerCase().includes(needle));
  setText("journal-count", journals.length);
  const tally = {};
  for (const j of journals) tally[j.consistency] = (tally[j.consistency] || 0) + 1;
  setText("tally", Object.entries(tally).map(([k, n]) => `${n} ${k}`).join(" · "));
  body.replaceChildren(...(shown.length ? shown.map(journalRow)
    : [el("tr", {}, el("td", { colspan: 8, class: "empty" }, journals.length ? "no match" : "no journals"))]));
}

// Consumer shards (docs/consumers.md): state, primary, standbys, offsets and lag.
function renderShards(shards) {
  const body = document.querySelector("#shards tbody");
  setText("shard-count", shards.length);
  body.replaceChildren(...(shards.length ? shards.map(s => el("tr", { "data-shard": s.id },
    el("td", { class: "name" }, s.id, el("div", { class: "muted small" }, `log ${s.recovery_log}`)),
    el("td", {}, el("span", { class: "state " + s.state.toLowerCase(), title: s.message || "" }, s.state)),
    el("td", {}, s.primary || "—"),
    el("td", {}, s.standbys.map(b => `${b.member} (${b.state})`).join(", ") || "—"),
    el("td", {}, ...s.sources.map(x => el("div", { title: `write head ${x.write_head}` },
      `${x.journal}@${x.offset} (lag ${bytes(x.lag)})`))),
    el("td", { class: "num" }, s.transactions)))
    : [el("tr", {}, el("td", { colspan: 6, class: "empty" }, "no shards"))]));
}

// Jobs (docs/jobs.md): runs by state, the newest runs, what the next window waits on.
function jobRunLine(r) {
  let state = r.state + (r.attempt > 1 ? ` (attempt ${r.attempt})` : "") + (r.rerun ? ` rerun ${r.rerun}` : "")
    + (r.backfill ? " backfill" : "");
  if (r.retry_at) state += ` · retry at ${isoTime(r.retry_at).slice(11)}`;
  const took = r.took === null ? (r.state === "running" ? "running" : "") : `${r.took.toFixed(1)}s`;
  return el("div", { class: "run", title: r.error || `worker ${r.worker || "—"}` },
    `${isoTime(r.window_start).slice(11)}–${isoTime(r.window_end).slice(11)} `,
    el("span", { class: "state " + r.state }, state), took ? ` ${took}` : "",
    r.error ? el("span", { class: "muted small" }, ` ${r.error}`) : null);
}

function jobNext(st) {
  if (!st) return "— (no sweep yet)";
  if (st.note) return st.note;
  const w = st.watermark_now || st.watermark;
  return `window ${isoTime(st.next_window).slice(11)} waits on ${st.waiting_on || "—"} (watermark ${isoTime(w)})`;
}

function renderJobs(jobs) {
  const body = document.querySelector("#jobs tbody");
  setText("job-count", jobs.length);
  body.replaceChildren(...(jobs.length ? jobs.map(j => el("tr", { "data-job": j.name },
    el("td", { class: "name" }, j.name, el("div", { class: "muted small" },
      `${j.selector} · every ${j.window}${j.suspend ? " · suspended" : ""}`)),
    el("td", {}, j.target, el("div", { class: "muted small" }, j.output ? `→ ${j.output}` : "")),
    el("td", {}, Object.entries(j.counts).map(([k, n]) => `${n} ${k}`).join(" · ") || "—"),
    el("td", {}, ...(j.runs.length ? j.runs.map(jobRunLine) : ["—"])),
    el("td", { class: "small" }, jobNext(j.status))))
    : [el("tr", {}, el("td", { colspan: 5, class: "empty" }, "no jobs"))]));
}

function renderErrors(errors) {
  const list = document.getElementById("errors");
  list.replaceChildren(...errors.map(e => el("li", {}, e)));
  list.hidden = !errors.length;
}

function render(state) {
  lastState = state;
  setText("etcd-url", state.etcd.url);
  setText("etcd-root", state.etcd.root);
  setText("etcd-revision", state.etcd.revision || "—");
  setText("leader", state.etcd.leader || "none");
  setText("updated", new Date(state.generated_at * 1000).toLocaleTimeString());
  renderErrors(state.errors);
  renderBrokers(state.brokers);
  renderJournals(state.journals);
  renderShards(state.shards || []);
  renderJobs(state.jobs || []);
  document.body.dataset.ready = "1";
}

async function refresh() {
  try {
    const resp = await fetch("/api/state", { cache: "no-store" });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    render(await resp.json());
  } catch (err) {
    renderErrors([`dashboard server unreachable: ${err.message}`]);
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

document.getElementById("filter").addEventListener("input", () => {
  if (lastState) renderJournals(lastState.journals);
});
refresh();
