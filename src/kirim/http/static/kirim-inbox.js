// <kirim-inbox server="https://kirim.example" recipient="1007" token="kfeed_…">
//
// kirim's in-app inbox as one custom element: a bell with the unseen count, the
// recipient's feed, mark read / unread, mark all read, archive; live by Server-Sent
// Events (GET /v1/recipients/{id}/feed/stream), resumed after a reconnect from the last
// event id, so nothing is missed nor shown twice. No build step, no framework: load it
// with <script type="module" src="https://kirim.example/static/kirim-inbox.js">.
// Styled by CSS custom properties (--kirim-inbox-accent, -bg, -fg, -muted, -border,
// -font, -width, -radius). docs/inbox.md, "Embedding <kirim-inbox>".

const CSS = `
:host { display: inline-block; position: relative; font: var(--kirim-inbox-font, 14px/1.4 system-ui, sans-serif);
  color: var(--kirim-inbox-fg, #1d2330); }
button { font: inherit; color: inherit; cursor: pointer; }
button:focus-visible { outline: 2px solid var(--kirim-inbox-accent, #3451d1); outline-offset: 2px; }
.bell { position: relative; background: none; border: 1px solid transparent; border-radius: 999px;
  padding: 6px; line-height: 0; }
.bell svg { width: 22px; height: 22px; fill: currentColor; }
.badge { position: absolute; top: -2px; right: -4px; min-width: 18px; height: 18px; padding: 0 5px;
  box-sizing: border-box; border-radius: 9px; background: var(--kirim-inbox-accent, #3451d1); color: #fff;
  font-size: 11px; font-weight: 600; line-height: 18px; text-align: center; }
.badge[hidden] { display: none; }
.panel { position: absolute; right: 0; z-index: 10; margin-top: 6px; width: var(--kirim-inbox-width, 360px);
  max-height: 480px; overflow: auto; background: var(--kirim-inbox-bg, #fff);
  border: 1px solid var(--kirim-inbox-border, #d7dbe3); border-radius: var(--kirim-inbox-radius, 10px);
  box-shadow: 0 8px 28px rgb(0 0 0 / 0.14); }
.panel[hidden] { display: none; }
header { display: flex; align-items: center; justify-content: space-between; padding: 10px 14px;
  border-bottom: 1px solid var(--kirim-inbox-border, #d7dbe3); }
h2 { margin: 0; font-size: 15px; }
.link { background: none; border: none; padding: 2px 4px; color: var(--kirim-inbox-accent, #3451d1); }
ul { list-style: none; margin: 0; padding: 0; }
li { padding: 10px 14px; border-bottom: 1px solid var(--kirim-inbox-border, #eceef3); }
li.unread { background: color-mix(in srgb, var(--kirim-inbox-accent, #3451d1) 7%, transparent); }
li.unread .title::before { content: "\\25CF  "; color: var(--kirim-inbox-accent, #3451d1); font-size: 10px; }
.title { font-weight: 600; }
.title a { color: inherit; }
.body { margin: 2px 0; }
.meta { display: flex; gap: 6px; align-items: center; color: var(--kirim-inbox-muted, #6b7280); font-size: 12px; }
.meta time { margin-right: auto; }
.empty { padding: 24px 14px; text-align: center; color: var(--kirim-inbox-muted, #6b7280); }
.sr { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; }
`;

const BELL =
  '<svg viewBox="0 0 24 24" aria-hidden="true"><path d="M12 22a2.5 2.5 0 0 0 2.45-2h-4.9A2.5 2.5 0 0 0 12 22Zm7-6V11a7 7 0 0 0-5.5-6.84V3.5a1.5 1.5 0 0 0-3 0v.66A7 7 0 0 0 5 11v5l-2 2v1h18v-1Z"/></svg>';

let count = 0;

class KirimInbox extends HTMLElement {
  static get observedAttributes() {
    return ["server", "recipient", "token"];
  }

  constructor() {
    super();
    this.items = new Map(); // id -> ITEM, the messages not archived
    this.counts = { unseen: 0, unread: 0 };
    this.lastEventId = null; // the number of the last event applied
    this.loaded = false;
    this.source = null;
    this.retryTimer = null;
    this.retryDelay = 1000;
    const id = `kirim-inbox-${++count}`;
    const root = this.attachShadow({ mode: "open" });
    root.innerHTML = `<style>${CSS}</style>
      <button class="bell" part="bell" type="button" aria-expanded="false" aria-controls="${id}">
        ${BELL}<span class="sr label">Notifications</span>
        <span class="badge" part="badge" aria-hidden="true" hidden></span>
      </button>
      <span class="sr status" aria-live="polite"></span>
      <div class="panel" part="panel" id="${id}" role="region" aria-label="Notifications" hidden>
        <header><h2>Notifications</h2>
          <button class="link mark-all" type="button">Mark all read</button></header>
        <ul aria-label="Messages"></ul>
        <p class="empty">No notifications</p>
      </div>`;
    this.$ = (sel) => root.querySelector(sel);
    this.$(".bell").addEventListener("click", () => this.toggle());
    this.$(".mark-all").addEventListener("click", () => this.markAll("read"));
    this.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && this.open) {
        this.toggle(false);
        this.$(".bell").focus();
      }
    });
  }

  get open() {
    return this.$(".bell").getAttribute("aria-expanded") === "true";
  }

  connectedCallback() {
    this.connect();
  }

  disconnectedCallback() {
    this.disconnect();
  }

  attributeChangedCallback(name, before, after) {
    // a new token (the application's refresh) reconnects from the last event
    if (before !== after && this.isConnected && this.source) this.connect();
  }

  // -- the API -------------------------------------------------------------------

  base() {
    const server = (this.getAttribute("server") || "").replace(/\/+$/, "");
    return `${server}/v1/recipients/${encodeURIComponent(this.getAttribute("recipient") || "")}/feed`;
  }

  async call(path, method = "GET", body = undefined) {
    const headers = { Authorization: `Bearer ${this.getAttribute("token") || ""}` };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const answer = await fetch(this.base() + path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (!answer.ok) throw new Error(`kirim answered ${answer.status}`);
    return answer.status === 204 ? null : answer.json();
  }

  async load() {
    const page = await this.call("?limit=50");
    for (const item of page.items) this.items.set(item.id, item);
    this.loaded = true;
    this.setCounts(page.counts);
    this.render();
  }

  async toggle(force) {
    const open = force === undefined ? !this.open : force;
    this.$(".bell").setAttribute("aria-expanded", String(open));
    this.$(".panel").hidden = !open;
    if (open && this.counts.unseen > 0) await this.markAll("seen"); // opening the bell
  }

  async markAll(state) {
    await this.call("/mark", "POST", { ids: null, state });
  }

  async act(item, action) {
    this.apply("state", await this.call(`/${item.id}/${action}`, "POST"));
  }

  // -- the stream ------------------------------------------------------------------

  connect() {
    this.disconnect();
    const params = new URLSearchParams({ token: this.getAttribute("token") || "" });
    if (this.lastEventId !== null) params.set("last_event_id", this.lastEventId);
    const source = new EventSource(`${this.base()}/stream?${params}`);
    this.source = source;
    for (const kind of ["message", "state", "deleted", "counts"]) {
      source.addEventListener(kind, (e) => this.onEvent(kind, e));
    }
    source.addEventListener("error", () => {
      // the browser retries by itself (with Last-Event-ID); once it gives up, so do we
      // not: reconnect by hand from the last event applied
      // (waiting longer each time, up to 30 s; the page hears of it, to give a new token)
      if (source.readyState === EventSource.CLOSED && this.source === source) {
        this.dispatchEvent(new CustomEvent("kirim-inbox-disconnected", { bubbles: true }));
        this.retryTimer = setTimeout(() => this.connect(), this.retryDelay);
        this.retryDelay = Math.min(this.retryDelay * 2, 30000);
      }
    });
  }

  disconnect() {
    clearTimeout(this.retryTimer);
    if (this.source) this.source.close();
    this.source = null;
  }

  onEvent(kind, event) {
    this.lastEventId = event.lastEventId;
    this.retryDelay = 1000;
    const data = JSON.parse(event.data);
    if (kind === "counts") {
      this.setCounts(data);
      if (!this.loaded) this.load(); // after the stream's start: nothing falls between
      return;
    }
    this.apply(kind, data);
  }

  apply(kind, data) {
    if (kind === "deleted" || (data.archived_at && kind !== "message")) {
      this.items.delete(data.id);
    } else if (!data.archived_at) {
      this.items.set(data.id, data);
    }
    if (kind === "message") this.$(".status").textContent = `New notification: ${data.title || ""}`;
    this.render();
  }

  setCounts(counts) {
    this.counts = counts;
    const badge = this.$(".badge");
    badge.textContent = counts.unseen > 99 ? "99+" : String(counts.unseen);
    badge.hidden = counts.unseen === 0;
    this.$(".label").textContent = `Notifications, ${counts.unseen} unseen, ${counts.unread} unread`;
    this.dataset.unseen = counts.unseen;
    this.dataset.unread = counts.unread;
  }

  // -- drawing ---------------------------------------------------------------------

  render() {
    const list = this.$("ul");
    const items = [...this.items.values()].sort((a, b) => b.id - a.id);
    list.replaceChildren(...items.map((item) => this.row(item)));
    this.$(".empty").hidden = items.length > 0;
  }

  row(item) {
    const li = document.createElement("li");
    li.dataset.id = item.id;
    li.className = item.read_at ? "read" : "unread";
    const title = document.createElement("div");
    title.className = "title";
    if (item.action_url && /^https?:\/\//i.test(item.action_url)) {
      const a = document.createElement("a");
      a.href = item.action_url;
      a.textContent = item.title || "(no title)";
      a.addEventListener("click", () => this.act(item, "read"));
      title.append(a);
    } else {
      title.textContent = item.title || "(no title)";
    }
    li.append(title);
    if (item.body) {
      const body = document.createElement("p");
      body.className = "body";
      body.textContent = item.body;
      li.append(body);
    }
    const meta = document.createElement("div");
    meta.className = "meta";
    const when = document.createElement("time");
    when.dateTime = item.created_at;
    when.textContent = new Date(item.created_at).toLocaleString();
    meta.append(when);
    const read = item.read_at ? "unread" : "read";
    meta.append(this.button(read === "read" ? "Mark read" : "Mark unread", item, read));
    meta.append(this.button("Archive", item, "archive"));
    li.append(meta);
    return li;
  }

  button(text, item, action) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = `link ${action}`;
    b.textContent = text;
    b.setAttribute("aria-label", `${text}: ${item.title || "message"}`);
    b.addEventListener("click", () => this.act(item, action));
    return b;
  }
}

if (!customElements.get("kirim-inbox")) customElements.define("kirim-inbox", KirimInbox);
export { KirimInbox };
