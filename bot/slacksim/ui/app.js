// slacksim web UI: renders /ui/state and acts through /ui/* endpoints.
// Live updates arrive as Server-Sent Events from /ui/events.
"use strict";

const params = new URLSearchParams(location.search);
const ui = {
  user: params.get("user") || localStorage.getItem("slacksim.user") || "",
  channel: params.get("channel") || "",
  thread: params.get("thread") || "",
  view: params.get("view") === "home" ? "home" : "channel",
  state: null,
  modalKey: "",
  fetching: null, // the running drain() promise, if any
  again: false, // another round is wanted after the running one
};

const $ = (id) => document.getElementById(id);

const LOCK = `<svg class="lock" viewBox="0 0 20 20" width="13" height="13" aria-label="private"><path fill="currentColor" d="M6 8V6a4 4 0 1 1 8 0v2h1a1 1 0 0 1 1 1v8a1 1 0 0 1-1 1H5a1 1 0 0 1-1-1V9a1 1 0 0 1 1-1h1Zm2 0h4V6a2 2 0 1 0-4 0v2Z"/></svg>`;

// A few emoji shortcodes bots commonly use.
const EMOJI = {
  x: "❌", white_check_mark: "✅", heavy_check_mark: "✔️", warning: "⚠️", hourglass: "⌛", hourglass_flowing_sand: "⏳",
  lock: "🔒", no_entry: "⛔", robot_face: "🤖", eyes: "👀", pencil2: "✏️", memo: "📝", rotating_light: "🚨",
  information_source: "ℹ️", question: "❓", thumbsup: "👍", "+1": "👍", thumbsdown: "👎", tada: "🎉", clock3: "🕒",
};

// ---------- helpers ----------

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

// decode undoes Slack's escaping (&amp; &lt; &gt;) in one pass.
function decode(s) {
  return String(s ?? "").replace(/&(amp|lt|gt);/g, (_, e) => ({ amp: "&", lt: "<", gt: ">" }[e]));
}

function userByID(id) {
  return (ui.state?.users || []).find((u) => u.id === id);
}

function displayName(id) {
  const u = userByID(id);
  if (!u) return id;
  return u.is_bot ? u.name : u.real_name || u.name;
}

function initials(name) {
  const parts = String(name).trim().split(/\s+/);
  return ((parts[0]?.[0] || "?") + (parts[1]?.[0] || "")).toUpperCase();
}

function colorFor(id) {
  const colors = ["#e8912d", "#2bac76", "#1264a3", "#e01e5a", "#9c27b0", "#00838f", "#6d4c41", "#c2185b"];
  let h = 0;
  for (const c of String(id)) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return colors[h % colors.length];
}

function timeOf(ts) {
  const d = new Date(parseFloat(ts) * 1000);
  return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

function toast(msg) {
  const t = $("toast");
  t.textContent = msg;
  t.classList.remove("hidden");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => t.classList.add("hidden"), 4000);
}

async function post(path, body) {
  const res = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ user: ui.user, ...body }) });
  const data = await res.json();
  if (!data.ok) toast((data.response_metadata?.messages || [data.error]).join(" "));
  return data;
}

// ---------- mrkdwn ----------

// inline formats one line of Slack-escaped text without code spans.
function inline(s) {
  let out = "";
  let last = 0;
  const re = /<([^<>]+)>/g;
  let m;
  while ((m = re.exec(s))) {
    out += styles(s.slice(last, m.index));
    out += control(m[1]);
    last = re.lastIndex;
  }
  return out + styles(s.slice(last));
}

// control renders a <…> control sequence as Slack does: user, channel and
// group mentions, broadcasts, dates and links. body is still Slack-escaped.
function control(body) {
  const bar = body.indexOf("|");
  const target = bar < 0 ? body : body.slice(0, bar);
  const label = bar < 0 ? "" : decode(body.slice(bar + 1));
  if (target.startsWith("@")) {
    const id = target.slice(1);
    const u = userByID(id);
    return `<span class="mention" data-user="${esc(id)}">@${esc(u?.name || label || id)}</span>`;
  }
  if (target.startsWith("#")) {
    const id = target.slice(1);
    const ch = (ui.state?.channels || []).find((c) => c.id === id);
    return `<span class="mention channel">#${esc(ch?.name || label || id)}</span>`;
  }
  if (target.startsWith("!")) return special(target.slice(1).split("^"), label);
  return link(decode(target), label);
}

// link renders <url> or <url|text>; only web and mail links are followed.
function link(url, label) {
  const safe = /^(https?:|mailto:)/i.test(url) ? url : "#";
  const text = label || url.replace(/^mailto:/i, "");
  return `<a href="${esc(safe)}" target="_blank" rel="noopener">${esc(text)}</a>`;
}

// special renders <!…>: @here/@channel/@everyone, user groups and dates.
function special([word, ...args], label) {
  switch (word) {
    case "here":
    case "channel":
    case "everyone":
      return `<span class="mention broadcast">@${word}</span>`;
    case "subteam": {
      // Slack shows a user group by its handle, as the page does.
      const group = (ui.state?.groups || []).find((g) => g.id === args[0]);
      const handle = label || group?.handle || args[0] || "group";
      return `<span class="mention">${esc(handle.startsWith("@") ? handle : "@" + handle)}</span>`;
    }
    case "date": {
      const text = slackDate(args[0], args[1], label);
      return args[2] ? link(decode(args[2]), text) : esc(text);
    }
    default:
      return esc(label || `<!${word}>`);
  }
}

const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
const WEEKDAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];

function ordinal(n) {
  const s = n % 100 >= 11 && n % 100 <= 13 ? "th" : ["th", "st", "nd", "rd"][n % 10] || "th";
  return n + s;
}

// slackDate formats <!date^epoch^format|fallback> in the viewer's time
// zone, as Slack does; a bad epoch shows the fallback text.
function slackDate(epoch, format, fallback) {
  const sec = Number(epoch);
  if (!/^-?\d+$/.test(String(epoch)) || !Number.isFinite(sec) || format === undefined) return fallback || "";
  const d = new Date(sec * 1000);
  if (Number.isNaN(d.getTime())) return fallback || "";
  const pad = (n) => String(n).padStart(2, "0");
  const day = new Date(d.getFullYear(), d.getMonth(), d.getDate());
  const now = new Date();
  const today = new Date(now.getFullYear(), now.getMonth(), now.getDate());
  const diff = Math.round((day - today) / 86400000);
  const rel = { "-1": "yesterday", 0: "today", 1: "tomorrow" }[diff];
  const month = MONTHS[d.getMonth()];
  const dateLong = `${month} ${ordinal(d.getDate())}, ${d.getFullYear()}`;
  const dateShort = `${month.slice(0, 3)} ${d.getDate()}, ${d.getFullYear()}`;
  const weekdayLong = `${WEEKDAYS[d.getDay()]}, ${dateLong}`;
  const tokens = {
    date_num: `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`,
    date: dateLong,
    date_short: dateShort,
    date_long: weekdayLong,
    date_pretty: rel || dateLong,
    date_short_pretty: rel || dateShort,
    date_long_pretty: rel || weekdayLong,
    time: d.toLocaleTimeString([], { hour: "numeric", minute: "2-digit" }),
    time_secs: d.toLocaleTimeString([], { hour: "numeric", minute: "2-digit", second: "2-digit" }),
    ago: ago(d, now),
  };
  let known = false;
  const out = decode(format).replace(/\{(\w+)\}/g, (all, name, at) => {
    if (!(name in tokens)) return all;
    known = true;
    const v = tokens[name];
    return at === 0 && rel && v === rel ? v[0].toUpperCase() + v.slice(1) : v;
  });
  return known ? out : fallback || out;
}

// ago is {ago}: "3 minutes ago", "in 2 hours".
function ago(d, now) {
  const s = Math.round((d - now) / 1000);
  const units = [["year", 31536000], ["month", 2592000], ["week", 604800], ["day", 86400], ["hour", 3600], ["minute", 60], ["second", 1]];
  const [unit, size] = units.find(([, n]) => Math.abs(s) >= n) || ["second", 1];
  return new Intl.RelativeTimeFormat("en", { numeric: "auto" }).format(Math.trunc(s / size), unit);
}

// styles applies *bold*, _italic_ and ~strike~ to plain (escaped) text.
function styles(s) {
  let h = esc(decode(s));
  h = h.replace(/:([a-z0-9_+-]+):/g, (all, name) => EMOJI[name] || all);
  h = h.replace(/(^|[^\w*])\*(?!\s)([^*\n]+?)\*(?!\w)/g, "$1<b>$2</b>");
  h = h.replace(/(^|[^\w_])_(?!\s)([^_\n]+?)_(?!\w)/g, "$1<i>$2</i>");
  h = h.replace(/(^|[^\w~])~(?!\s)([^~\n]+?)~(?!\w)/g, "$1<s>$2</s>");
  return h;
}

function inlineWithCode(s) {
  return s
    .split(/(`[^`\n]+`)/)
    .map((part) => (/^`[^`\n]+`$/.test(part) ? `<code>${esc(decode(part.slice(1, -1)))}</code>` : inline(part)))
    .join("");
}

function mrkdwn(text) {
  const parts = String(text ?? "").split(/```/);
  let html = "";
  parts.forEach((part, i) => {
    if (i % 2 === 1) {
      html += `<pre>${esc(decode(part.replace(/^\n/, "")))}</pre>`;
      return;
    }
    const lines = part.split("\n");
    let quote = [];
    const flush = () => {
      if (quote.length) html += `<blockquote>${quote.join("<br>")}</blockquote>`;
      quote = [];
    };
    lines.forEach((line, j) => {
      const q = line.match(/^(&gt;|>)\s?(.*)$/);
      if (q) {
        quote.push(inlineWithCode(q[2]));
        return;
      }
      flush();
      html += inlineWithCode(line);
      if (j < lines.length - 1) html += "<br>";
    });
    flush();
  });
  return html;
}

function textObject(t) {
  if (!t) return "";
  return t.type === "mrkdwn" ? mrkdwn(t.text) : esc(t.text).replace(/\n/g, "<br>");
}

// ---------- Block Kit ----------

// ctx: {kind: "message"|"modal"|"home", channel, ts, viewId, errors}
function renderBlocks(blocks, ctx) {
  return `<div class="blocks">${(blocks || []).map((b) => renderBlock(b, ctx)).join("")}</div>`;
}

function renderBlock(b, ctx) {
  const bid = esc(b.block_id || "");
  switch (b.type) {
    case "header":
      return `<div class="bk-header" data-block-id="${bid}">${esc(b.text?.text)}</div>`;
    case "section": {
      const fields = b.fields ? `<div class="bk-fields">${b.fields.map((f) => `<div>${textObject(f)}</div>`).join("")}</div>` : "";
      const acc = b.accessory ? `<div class="bk-accessory">${renderElement(b.accessory, ctx)}</div>` : "";
      return `<div class="bk-section" data-block-id="${bid}"><div class="bk-section-main">${b.text ? `<div class="msg-text">${textObject(b.text)}</div>` : ""}${fields}</div>${acc}</div>`;
    }
    case "context":
      return `<div class="bk-context" data-block-id="${bid}">${(b.elements || [])
        .map((e) => (e.type === "image" ? `<img src="${esc(e.image_url)}" alt="${esc(e.alt_text)}">` : `<span>${textObject(e)}</span>`))
        .join("")}</div>`;
    case "divider":
      return `<hr class="bk-divider">`;
    case "actions":
      return `<div class="bk-actions" data-block-id="${bid}">${(b.elements || []).map((e) => renderElement(e, ctx)).join("")}</div>`;
    case "image":
      return `<div class="bk-image">${b.title ? `<div>${esc(b.title.text)}</div>` : ""}<img src="${esc(b.image_url)}" alt="${esc(b.alt_text)}"></div>`;
    case "input":
      return renderInput(b, ctx);
    case "rich_text":
      return `<div class="msg-text">${esc(richText(b))}</div>`;
    case "markdown":
      return `<div class="msg-text">${mrkdwn(b.text)}</div>`;
    default:
      return `<div class="bk-unknown">[${esc(b.type)} block]</div>`;
  }
}

function richText(b) {
  const walk = (els) => (els || []).map((e) => (e.text ?? (e.type === "user" ? "@" + displayName(e.user_id) : walk(e.elements)))).join("");
  return walk(b.elements);
}

function actionAttrs(e, ctx) {
  return `data-action-id="${esc(e.action_id)}" data-kind="${ctx.kind}" data-channel="${esc(ctx.channel || "")}" data-ts="${esc(ctx.ts || "")}" data-view-id="${esc(ctx.viewId || "")}"`;
}

function renderElement(e, ctx) {
  switch (e.type) {
    case "button": {
      const style = e.style ? ` ${esc(e.style)}` : "";
      const confirm = e.confirm ? ` data-confirm="${esc(JSON.stringify(e.confirm))}"` : "";
      const url = e.url ? ` data-url="${esc(e.url)}"` : "";
      return `<button type="button" class="bk-button${style}" data-testid="button" ${actionAttrs(e, ctx)}${confirm}${url}>${esc(e.text?.text)}</button>`;
    }
    case "static_select":
    case "overflow": {
      const opts = e.options || (e.option_groups || []).flatMap((g) => g.options);
      const ph = e.type === "overflow" ? "⋯" : e.placeholder?.text || "Select an item";
      return `<select class="bk-select" data-testid="select" ${actionAttrs(e, ctx)}><option value="">${esc(ph)}</option>${opts
        .map((o) => `<option value="${esc(o.value)}">${esc(o.text?.text)}</option>`)
        .join("")}</select>`;
    }
    case "image":
      return `<img src="${esc(e.image_url)}" alt="${esc(e.alt_text)}" style="width:72px;height:72px;border-radius:6px">`;
    default:
      return `<span class="bk-unknown">[${esc(e.type)}]</span>`;
  }
}

function renderInput(b, ctx) {
  const e = b.element || {};
  const bid = esc(b.block_id);
  const aid = esc(e.action_id);
  const ph = e.placeholder?.text ? ` placeholder="${esc(e.placeholder.text)}"` : "";
  const common = `data-block-id="${bid}" data-action-id="${aid}" data-type="${esc(e.type)}" data-testid="input-${bid}"`;
  let control = "";
  switch (e.type) {
    case "plain_text_input":
      control = e.multiline
        ? `<textarea ${common}${ph}>${esc(e.initial_value)}</textarea>`
        : `<input type="text" ${common}${ph} value="${esc(e.initial_value)}">`;
      break;
    case "number_input":
      control = `<input type="number" step="${e.is_decimal_allowed ? "any" : "1"}" ${common}${ph} value="${esc(e.initial_value)}">`;
      break;
    case "email_text_input":
      control = `<input type="email" ${common}${ph} value="${esc(e.initial_value)}">`;
      break;
    case "url_text_input":
      control = `<input type="url" ${common}${ph} value="${esc(e.initial_value)}">`;
      break;
    case "static_select": {
      const opts = e.options || (e.option_groups || []).flatMap((g) => g.options);
      const init = e.initial_option?.value;
      control = `<select ${common}><option value="">${esc(e.placeholder?.text || "Select an item")}</option>${opts
        .map((o) => `<option value="${esc(o.value)}"${o.value === init ? " selected" : ""}>${esc(o.text?.text)}</option>`)
        .join("")}</select>`;
      break;
    }
    case "checkboxes":
    case "radio_buttons": {
      const init = new Set((e.initial_options || (e.initial_option ? [e.initial_option] : [])).map((o) => o.value));
      const kind = e.type === "checkboxes" ? "checkbox" : "radio";
      control = `<div class="checks" ${common}>${(e.options || [])
        .map(
          (o) =>
            `<label><input type="${kind}" name="${bid}" value="${esc(o.value)}"${init.has(o.value) ? " checked" : ""} data-testid="check-${bid}-${esc(o.value)}"> ${textObject(o.text)}</label>`,
        )
        .join("")}</div>`;
      break;
    }
    default:
      control = `<div class="bk-unknown">[${esc(e.type)} input]</div>`;
  }
  const err = ctx.errors?.[b.block_id];
  return `<div class="bk-input${err ? " has-error" : ""}" data-block-id="${bid}">
    <label>${esc(b.label?.text)}${b.optional ? ' <span class="optional">(optional)</span>' : ""}</label>
    ${control}
    ${b.hint ? `<div class="bk-hint">${esc(b.hint.text)}</div>` : ""}
    <div class="field-error" data-testid="error-${bid}">${esc(err || "")}</div>
  </div>`;
}

// ---------- rendering ----------

function renderMessage(m, opts = {}) {
  const name = displayName(m.user);
  const bot = m.is_bot;
  const avatar = bot
    ? `<div class="avatar bot">${esc(initials(name))}</div>`
    : `<div class="avatar" style="background:${colorFor(m.user)}">${esc(initials(name))}</div>`;
  const hasBlocks = Array.isArray(m.blocks) && m.blocks.length > 0;
  const body = hasBlocks
    ? renderBlocks(m.blocks, { kind: "message", channel: ui.channel, ts: m.ts })
    : `<div class="msg-text">${mrkdwn(m.text)}</div>`;
  let thread = "";
  if (!opts.inThread && m.reply_count > 0) {
    thread = `<div class="thread-link" data-testid="thread-link" data-thread="${esc(m.ts)}">${m.reply_count} ${m.reply_count === 1 ? "reply" : "replies"}${
      m.latest_reply ? `<span class="last">Last reply ${esc(timeOf(m.latest_reply))}</span>` : ""
    }</div>`;
  }
  const actions = !opts.inThread && !m.ephemeral ? `<div class="msg-actions"><button data-reply="${esc(m.ts)}" data-testid="reply-in-thread">Reply in thread</button></div>` : "";
  return `<div class="msg${m.ephemeral ? " ephemeral" : ""}" data-testid="message" data-ts="${esc(m.ts)}" data-user="${esc(m.user)}">
    ${avatar}
    <div class="msg-body">
      <div class="msg-head"><span class="msg-author">${esc(name)}</span>${bot ? '<span class="app-badge">APP</span>' : ""}<span class="msg-time" title="${esc(m.ts)}">${esc(timeOf(m.ts))}</span></div>
      ${m.ephemeral ? '<div class="ephemeral-note" data-testid="ephemeral-note">Only visible to you</div>' : ""}
      ${body}
      ${thread}
    </div>
    ${actions}
  </div>`;
}

function renderSidebar(st) {
  $("ws-name").textContent = st.team;
  document.title = `${st.team} · local Slack`;
  const sel = $("user-select");
  const humans = st.users.filter((u) => !u.is_bot);
  const opts = humans.map((u) => `<option value="${esc(u.id)}"${u.id === st.me ? " selected" : ""}>${esc(u.real_name || u.name)} (@${esc(u.name)})</option>`).join("");
  if (sel.innerHTML !== opts) sel.innerHTML = opts;
  sel.value = st.me;
  const item = (c) => {
    const active = ui.view === "channel" && c.id === ui.channel ? " active" : "";
    const icon = c.is_im ? '<span class="presence"></span>' : c.is_private ? `<span class="nav-icon">${LOCK}</span>` : '<span class="nav-icon">#</span>';
    return `<li><a href="#" class="nav-item${active}" data-channel="${esc(c.id)}" data-testid="channel-${esc(c.name)}">${icon}<span>${esc(c.name)}</span></a></li>`;
  };
  $("channel-list").innerHTML = st.channels.filter((c) => !c.is_im).map(item).join("");
  $("dm-list").innerHTML = st.channels.filter((c) => c.is_im).map(item).join("");
  $("home-label").textContent = `${st.bot_name} · Home`;
  $("home-link").classList.toggle("active", ui.view === "home");
}

function scrolledToBottom(el) {
  return el.scrollHeight - el.scrollTop - el.clientHeight < 40;
}

function render() {
  const st = ui.state;
  if (!st) return;
  renderSidebar(st);
  const homeMode = ui.view === "home";
  $("messages").classList.toggle("hidden", homeMode);
  $("composer").classList.toggle("hidden", homeMode);
  $("home").classList.toggle("hidden", !homeMode);
  if (homeMode) {
    $("channel-title").textContent = st.bot_name;
    $("channel-sub").textContent = "Home";
    $("home").innerHTML = st.home
      ? renderBlocks(st.home.blocks || [], { kind: "home", viewId: st.home.id })
      : `<div class="empty">${esc(st.bot_name)} has not published a Home tab for you yet.</div>`;
  } else if (st.channel) {
    const c = st.channel;
    $("channel-title").innerHTML = c.is_im ? esc(c.name) : (c.is_private ? LOCK : "#") + " " + esc(c.name);
    $("channel-sub").textContent = c.is_im ? "Direct message with the app" : "";
    $("composer-input").placeholder = c.is_im ? `Message ${c.name}` : `Message #${c.name}`;
    const list = $("messages");
    const stick = scrolledToBottom(list) || list.dataset.channel !== c.id;
    list.dataset.channel = c.id;
    list.innerHTML = st.messages.length
      ? st.messages.map((m) => renderMessage(m)).join("")
      : `<div class="empty">This is the very beginning of ${c.is_im ? "your conversation" : "#" + esc(c.name)}.</div>`;
    if (stick) list.scrollTop = list.scrollHeight;
  }
  renderThread(st);
  renderModal(st);
}

function renderThread(st) {
  const panel = $("thread-panel");
  if (!ui.thread || !st.thread || ui.view !== "channel") {
    panel.classList.add("hidden");
    return;
  }
  panel.classList.remove("hidden");
  $("thread-channel").textContent = st.channel ? (st.channel.is_im ? st.channel.name : "#" + st.channel.name) : "";
  const box = $("thread-messages");
  const stick = scrolledToBottom(box) || box.dataset.thread !== ui.thread;
  box.dataset.thread = ui.thread;
  const n = st.thread.replies.length;
  box.innerHTML =
    renderMessage(st.thread.parent, { inThread: true }) +
    `<div class="reply-sep">${n} ${n === 1 ? "reply" : "replies"}</div>` +
    st.thread.replies.map((m) => renderMessage(m, { inThread: true })).join("");
  if (stick) box.scrollTop = box.scrollHeight;
}

function renderModal(st) {
  const root = $("modal-root");
  const v = st.modal;
  if (!v) {
    root.innerHTML = "";
    ui.modalKey = "";
    return;
  }
  const key = v.id + ":" + v.hash;
  if (key === ui.modalKey) {
    // Same view: keep what the person typed, refresh only the errors.
    root.querySelectorAll(".bk-input").forEach((el) => {
      const err = v.errors?.[el.dataset.blockId] || "";
      el.classList.toggle("has-error", !!err);
      el.querySelector(".field-error").textContent = err;
    });
    return;
  }
  ui.modalKey = key;
  const blocks = v.blocks || [];
  root.innerHTML = `<div class="modal-backdrop" data-testid="modal" data-view-id="${esc(v.id)}">
    <form class="modal" id="modal-form">
      <div class="modal-header">
        ${v.depth > 1 ? '<button type="button" class="icon-button" data-testid="modal-back" id="modal-back" title="Back">←</button>' : ""}
        <div class="modal-app">${esc(initials(st.bot_name))}</div>
        <h2 data-testid="modal-title">${esc(v.title)}</h2>
        <button type="button" class="icon-button" id="modal-x" data-testid="modal-x" title="Close">✕</button>
      </div>
      <div class="modal-body">${blocks.map((b) => renderBlock(b, { kind: "modal", viewId: v.id, errors: v.errors })).join("")}</div>
      <div class="modal-footer">
        <button type="button" class="bk-button" id="modal-close" data-testid="modal-close">${esc(v.close || "Cancel")}</button>
        ${v.submit ? `<button type="submit" class="bk-button primary" id="modal-submit" data-testid="modal-submit">${esc(v.submit)}</button>` : ""}
      </div>
    </form>
  </div>`;
  const first = root.querySelector(".modal-body input, .modal-body textarea, .modal-body select");
  if (first) first.focus();
}

function modalValues() {
  const values = {};
  document.querySelectorAll("#modal-root [data-action-id][data-block-id]").forEach((el) => {
    const bid = el.dataset.blockId;
    const aid = el.dataset.actionId;
    let val;
    switch (el.dataset.type) {
      case "checkboxes":
        val = [...el.querySelectorAll("input:checked")].map((i) => i.value);
        break;
      case "radio_buttons":
        val = el.querySelector("input:checked")?.value ?? "";
        break;
      default:
        val = el.value;
    }
    (values[bid] ||= {})[aid] = val;
  });
  return values;
}

// ---------- data ----------

// refresh fetches /ui/state for the current user, channel and thread and
// renders it. One fetch runs at a time; calls made meanwhile ask for one
// more round, and the returned promise settles once the latest state is
// rendered. An answer is used only if the user, channel and thread are
// still the ones it was asked for: an answer started before the person
// switched user (or channel) would otherwise put the old one back.
function refresh() {
  ui.again = true;
  if (!ui.fetching) ui.fetching = drain().finally(() => (ui.fetching = null));
  return ui.fetching;
}

async function drain() {
  while (ui.again) {
    ui.again = false;
    const asked = { user: ui.user, channel: ui.channel, thread: ui.thread };
    let st;
    try {
      st = await (await fetch("/ui/state?" + new URLSearchParams(asked))).json();
    } catch (e) {
      console.error(e);
      continue;
    }
    if (ui.user !== asked.user || ui.channel !== asked.channel || ui.thread !== asked.thread) {
      ui.again = true; // stale: ask again for what is wanted now
      continue;
    }
    // Adopt the server's pick only when the page has no (usable) user of
    // its own: first visit, or a remembered user that no longer exists.
    const known = (st.users || []).some((u) => u.id === ui.user && !u.is_bot);
    if (st.me && (!ui.user || !known) && st.me !== ui.user) {
      ui.user = st.me;
      ui.again = true;
      continue;
    }
    if (!st.channel && ui.view === "channel" && st.channels?.length && ui.channel !== st.channels[0].id) {
      ui.channel = st.channels[0].id;
      ui.thread = "";
      ui.again = true;
      continue;
    }
    ui.state = st;
    syncURL();
    render();
  }
}

function syncURL() {
  const q = new URLSearchParams({ user: ui.user });
  if (ui.view === "home") q.set("view", "home");
  else {
    if (ui.channel) q.set("channel", ui.channel);
    if (ui.thread) q.set("thread", ui.thread);
  }
  history.replaceState(null, "", "?" + q);
  localStorage.setItem("slacksim.user", ui.user);
}

// ---------- events ----------

async function send(input, threadTS) {
  const text = input.value.trim();
  if (!text) return;
  input.value = "";
  autosize(input);
  await post("/ui/post", { channel: ui.channel, text, thread_ts: threadTS || "" });
}

function autosize(t) {
  t.style.height = "auto";
  t.style.height = Math.min(t.scrollHeight, 200) + "px";
}

function bindComposer(form, input, threadTS) {
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    send(input, threadTS());
  });
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send(input, threadTS());
    }
  });
  input.addEventListener("input", () => autosize(input));
}

async function act(el, value) {
  if (el.dataset.confirm) {
    const c = JSON.parse(el.dataset.confirm);
    if (!confirm(`${c.title?.text || "Are you sure?"}\n\n${c.text?.text || ""}`)) return;
  }
  if (el.dataset.url) window.open(el.dataset.url, "_blank", "noopener");
  const body = { action_id: el.dataset.actionId, value: value || "" };
  if (el.dataset.kind === "message") Object.assign(body, { channel: el.dataset.channel, ts: el.dataset.ts });
  else body.view_id = el.dataset.viewId;
  el.disabled = true;
  try {
    await post("/ui/click", body);
  } finally {
    setTimeout(() => (el.disabled = false), 400);
  }
}

document.addEventListener("click", (e) => {
  const t = e.target;
  const nav = t.closest("[data-channel].nav-item");
  if (nav) {
    e.preventDefault();
    ui.view = "channel";
    ui.channel = nav.dataset.channel;
    ui.thread = "";
    refresh();
    return;
  }
  if (t.closest("#home-link")) {
    e.preventDefault();
    ui.view = "home";
    ui.thread = "";
    post("/ui/home", {});
    refresh();
    return;
  }
  const threadLink = t.closest("[data-thread]") || t.closest("[data-reply]");
  if (threadLink) {
    ui.thread = threadLink.dataset.thread || threadLink.dataset.reply;
    refresh().then(() => $("thread-input").focus());
    return;
  }
  if (t.closest("#thread-close")) {
    ui.thread = "";
    refresh();
    return;
  }
  const button = t.closest("button.bk-button[data-action-id]");
  if (button) {
    act(button);
    return;
  }
  if (t.closest("#modal-close") || t.closest("#modal-x") || t.closest("#modal-back")) {
    const v = ui.state?.modal;
    if (v) post("/ui/close", { view_id: v.id });
    return;
  }
});

document.addEventListener("change", (e) => {
  const sel = e.target.closest("select.bk-select[data-action-id]");
  if (sel && sel.value) act(sel, sel.value);
});

document.addEventListener("submit", async (e) => {
  if (e.target.id !== "modal-form") return;
  e.preventDefault();
  const v = ui.state?.modal;
  if (!v) return;
  const btn = $("modal-submit");
  if (btn) btn.disabled = true;
  try {
    const res = await post("/ui/submit", { view_id: v.id, values: modalValues() });
    if (res.ok && res.errors) {
      document.querySelectorAll("#modal-root .bk-input").forEach((el) => {
        const err = res.errors[el.dataset.blockId] || "";
        el.classList.toggle("has-error", !!err);
        el.querySelector(".field-error").textContent = err;
      });
    }
  } finally {
    if (btn) btn.disabled = false;
  }
});

document.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && ui.state?.modal) post("/ui/close", { view_id: ui.state.modal.id });
});

$("user-select").addEventListener("change", (e) => {
  ui.user = e.target.value;
  ui.thread = "";
  ui.modalKey = "";
  if (ui.view === "home") post("/ui/home", {});
  refresh();
});

bindComposer($("composer"), $("composer-input"), () => "");
bindComposer($("thread-composer"), $("thread-input"), () => ui.thread);

const events = new EventSource("/ui/events");
events.onmessage = () => refresh();
if (ui.view === "home" && ui.user) post("/ui/home", {});
refresh();
