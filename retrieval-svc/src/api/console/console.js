// engram memory console: plain JavaScript over the REST routes (/v1/...).
// The key is kept in this closure only; memory text is always drawn with
// textContent, never parsed as HTML.
"use strict";

(() => {
  let key = null;
  const $ = (id) => document.getElementById(id);

  // An element with attributes and children (strings become text nodes).
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k.startsWith("data-")) e.setAttribute(k, v);
      else e[k] = v;
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(typeof c === "string" || typeof c === "number" ? String(c) : c);
    }
    return e;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  }

  function showError(message) {
    const e = $("error");
    e.textContent = message;
    e.hidden = !message;
  }

  // POST a JSON body to a REST route with the key; the answer's JSON, or
  // an Error carrying the API's message (the field and the rule).
  async function api(path, body) {
    const resp = await fetch(path, {
      method: "POST",
      headers: { "Authorization": "Bearer " + key, "Content-Type": "application/json" },
      body: JSON.stringify(body || {}),
      cache: "no-store",
      credentials: "omit",
    });
    const json = await resp.json().catch(() => ({}));
    if (!resp.ok) {
      const msg = (json.error && json.error.message) || resp.statusText;
      throw new Error(`${path}: ${resp.status} ${msg}`);
    }
    return json;
  }

  // Runs an action, showing its error instead of throwing.
  async function guarded(action) {
    showError("");
    try {
      await action();
    } catch (e) {
      showError(e.message);
    }
  }

  const short = (s, n) => (s && s.length > n ? s.slice(0, n - 1) + "…" : s || "");
  const day = (ts) => (ts ? String(ts).slice(0, 19).replace("T", " ") : "");
  const named = (v, prefix) => String(v || "").replace(prefix, "").toLowerCase();

  function openButton(id, text) {
    const b = el("button", { type: "button", class: "link open-memory", "data-id": id }, text);
    b.addEventListener("click", () => guarded(() => openMemory(id)));
    return b;
  }

  // --- signing in -------------------------------------------------------

  async function signIn(candidate) {
    key = candidate;
    let listed;
    try {
      listed = await api("/v1/memories/list", { page_size: 1 });
    } catch (e) {
      key = null;
      throw e;
    }
    $("who").textContent = "tenant " + listed.tenant;
    $("tenant").textContent = listed.tenant;
    $("login").hidden = true;
    $("app").hidden = false;
    $("logout").hidden = false;
    await Promise.all([loadCounts(), loadConflicts()]);
  }

  function signOut() {
    key = null;
    waiting = "…";
    for (const id of ["answer", "memory-view"]) $(id).hidden = true;
    for (const id of ["counts", "results", "conflicts-list"]) {
      clear($(id).querySelector("tbody"));
    }
    $("app").hidden = true;
    $("logout").hidden = true;
    $("login").hidden = false;
    $("who").textContent = "not signed in";
    $("key").value = "";
  }

  // --- counts -----------------------------------------------------------

  const COUNT_PAGES = 20;

  async function loadCounts() {
    const byType = {}, byNamespace = {};
    let total = 0, historical = 0, token = "", pages = 0;
    do {
      const page = await api("/v1/memories/list", {
        page_size: 1000, page_token: token, include_historical: true,
      });
      for (const m of page.memories || []) {
        total += 1;
        if (m.retracted_at || m.valid_to) historical += 1;
        byType[m.memory_type || "episodic"] = (byType[m.memory_type || "episodic"] || 0) + 1;
        byNamespace[m.namespace || "default"] = (byNamespace[m.namespace || "default"] || 0) + 1;
      }
      token = page.next_page_token;
      pages += 1;
    } while (token && pages < COUNT_PAGES);
    const more = token ? "+" : "";
    const body = clear($("counts").querySelector("tbody"));
    const row = (k, v, attrs = {}) =>
      body.append(el("tr", {}, el("th", {}, k), el("td", attrs, String(v))));
    row("memories", total + more);
    row("of which history (superseded, closed or retracted)", historical + more);
    row("by type", Object.entries(byType).map(([k, v]) => `${k} ${v}`).join(", "));
    row("by namespace", Object.entries(byNamespace).map(([k, v]) => `${k} ${v}`).join(", "));
    row("conflicts awaiting review", waiting, { id: "conflicts-waiting" });
  }

  // How many conflicts await review, as the queue last listed them: one
  // list call serves the queue and the count, and a decision refreshes
  // only these, not the memory counts.
  let waiting = "…";

  function showWaiting() {
    const cell = $("conflicts-waiting");
    if (cell) cell.textContent = waiting;
  }

  // --- search with explain ----------------------------------------------

  async function search(text) {
    const answer = await api("/v1/retrieve", {
      text, explain: true, token_budget: 600, no_cache: true,
      include_historical: $("historical").checked,
    });
    drawAnswer(answer);
  }

  function drawAnswer(a) {
    $("answer").hidden = false;
    $("route-line").textContent =
      `route ${named(a.route, "QUERY_ROUTE_")} · ${a.total_candidates} candidates · ` +
      `confidence ${Number(a.retrieval_confidence).toFixed(2)} · ` +
      `evidence ${Number(a.evidence_score).toFixed(2)} · ${Number(a.latency_ms).toFixed(1)} ms` +
      ((a.degraded_stages || []).length ? ` · degraded: ${a.degraded_stages.join(", ")}` : "");
    $("flag").hidden = !a.nothing_relevant;
    const body = clear($("results").querySelector("tbody"));
    for (const r of a.records || []) body.append(recordRow(r));
    const conflicts = clear($("answer-conflicts"));
    for (const c of a.conflicts || []) {
      conflicts.append(el("li", { class: "answer-conflict" },
        `${c.edge_type}: `, openButton(c.memory_a, short(c.memory_a, 13)), " vs ",
        openButton(c.memory_b, short(c.memory_b, 13)),
        ` → ${named(c.resolution, "CONFLICT_RESOLUTION_")}`,
        c.winner_id ? ` (winner ${short(c.winner_id, 13)})` : "",
        c.reason ? ` — ${c.reason}` : ""));
    }
    const dropped = clear($("dropped"));
    for (const d of a.dropped || []) {
      dropped.append(el("li", {}, openButton(d.memory_id, short(d.memory_id, 13)),
        ` at ${d.stage}: ${d.reason}`));
    }
    drawStages(a.stage_latencies || []);
    $("context").textContent = a.context_block || "(no context block)";
  }

  function recordRow(r) {
    const m = r.memory || {};
    const p = r.provenance || {};
    const found = (p.strategies || []).map((s) => el("span", { class: "tag" }, `${s.strategy} @ ${s.rank}`));
    const via = (p.via_entities || []).length ? ` via ${p.via_entities.join(", ")}` : "";
    const historical = m.valid_to || m.retracted_at;
    return el("tr", { class: "record", "data-id": m.id },
      el("td", {}, String(r.rank)),
      el("td", {}, Number(r.score).toFixed(3)),
      el("td", { class: historical ? "historical" : "" },
        openButton(m.id, short(m.content, 240)),
        el("div", { class: "muted" }, `${m.memory_type} · ${day(m.event_time)} · ${p.citation || ""}`)),
      el("td", {}, ...found, via),
      el("td", {}, (p.checks_passed || []).join(", ")));
  }

  function drawStages(stages) {
    const body = clear($("stages").querySelector("tbody"));
    const worst = Math.max(1, ...stages.map((s) => Number(s.ms)));
    for (const s of stages) {
      const width = Math.round((200 * Number(s.ms)) / worst);
      const bar = el("span", { class: "bar" });
      bar.style.width = `${width}px`;
      body.append(el("tr", {}, el("td", {}, s.stage), el("td", {}, `${Number(s.ms).toFixed(2)} ms`), el("td", {}, bar)));
    }
  }

  // --- one memory: versions, names, graph neighbours ----------------------

  async function openMemory(id) {
    $("memory-id").value = id;
    const got = await api("/v1/memories/get", { ids: [id], include_history: true });
    const m = (got.memories || [])[0];
    if (!m) throw new Error(`no memory ${id} that this key can read`);
    $("memory-view").hidden = false;
    $("m-content").textContent = m.content;
    const meta = clear($("m-meta").querySelector("tbody"));
    const row = (k, v) => v && meta.append(el("tr", {}, el("th", {}, k), el("td", {}, v)));
    row("id", m.id);
    row("title", m.title);
    row("type", m.memory_type);
    row("namespace", m.namespace);
    row("access level", named(m.access_level, "ACCESS_LEVEL_"));
    row("event time", day(m.event_time));
    row("recorded", day(m.recorded_at || m.ingestion_time));
    row("valid until", day(m.valid_to));
    row("retracted", day(m.retracted_at));
    row("source", m.source);
    if (m.supersedes) meta.append(el("tr", {}, el("th", {}, "replaces"), el("td", {}, openButton(m.supersedes, m.supersedes))));
    const history = clear($("m-history"));
    for (const v of m.history || []) {
      history.append(el("li", { class: "version historical" },
        `v${v.version} (recorded ${day(v.recorded_at)}, replaced ${day(v.replaced_at)}): ${v.content}`));
    }
    history.append(el("li", { class: "version" }, `v${m.version} (current): ${m.content}`));
    const names = clear($("m-entities"));
    for (const n of m.entities || []) names.append(el("span", { class: "tag" }, n));
    await drawNeighbours(m);
  }

  // Memories the graph strategy reaches from this memory's names.
  async function drawNeighbours(m) {
    const list = clear($("m-neighbours"));
    const names = (m.entities || []).slice(0, 8);
    if (!names.length) {
      list.append(el("li", { class: "muted" }, "no names, so no graph neighbours"));
      return;
    }
    const a = await api("/v1/retrieve", { text: names.join(", "), explain: true, limit: 10, no_cache: true });
    const near = (a.records || []).filter((r) => r.memory.id !== m.id &&
      ((r.provenance.via_entities || []).length || (r.provenance.strategies || []).some((s) => s.strategy === "graph")));
    for (const r of near) {
      const via = (r.provenance.via_entities || []).join(", ");
      list.append(el("li", { class: "neighbour" }, openButton(r.memory.id, short(r.memory.content, 160)),
        via ? el("span", { class: "muted" }, ` via ${via}`) : null));
    }
    if (!near.length) list.append(el("li", { class: "muted" }, "the graph reaches no other memory"));
  }

  // --- the conflicts review queue --------------------------------------

  async function loadConflicts() {
    const listed = await api("/v1/conflicts/list", { page_size: 200 });
    waiting = (listed.conflicts || []).length + (listed.next_page_token ? "+" : "");
    showWaiting();
    const body = clear($("conflicts-list").querySelector("tbody"));
    for (const c of listed.conflicts || []) {
      const decide = (decision, label, cls) => {
        const b = el("button", { type: "button", class: cls }, label);
        b.addEventListener("click", () => guarded(async () => {
          await api("/v1/conflicts/review", { new_id: c.new_id, old_id: c.old_id, decision });
          await loadConflicts();
        }));
        return b;
      };
      body.append(el("tr", { class: "conflict", "data-new": c.new_id, "data-old": c.old_id },
        el("td", {}, openButton(c.new_id, c.new_content)),
        el("td", {}, openButton(c.old_id, c.old_content)),
        el("td", {}, Number(c.score).toFixed(2)),
        el("td", {}, c.reason),
        el("td", {}, decide("CONFLICT_DECISION_CONFIRM", "Confirm", "confirm"), " ",
          decide("CONFLICT_DECISION_REJECT", "Reject", "reject"))));
    }
    if (!(listed.conflicts || []).length) {
      body.append(el("tr", {}, el("td", { colSpan: 5, class: "muted" }, "nothing awaits review")));
    }
  }

  // --- wiring -----------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (e) => {
      e.preventDefault();
      guarded(() => signIn($("key").value.trim()));
    });
    $("logout").addEventListener("click", signOut);
    $("search-form").addEventListener("submit", (e) => {
      e.preventDefault();
      guarded(() => search($("q").value));
    });
    $("open-form").addEventListener("submit", (e) => {
      e.preventDefault();
      guarded(() => openMemory($("memory-id").value.trim()));
    });
    $("conflicts-refresh").addEventListener("click", () => guarded(loadConflicts));
  });
})();
