// countersign.mjs: the few calls of Countersign's HTTP API (/v1) this
// example makes, with Node's fetch and no dependency. docs/api.md is the
// contract. Every failure throws: treat a throw as "do not run" (fail
// closed).

export class CountersignError extends Error {
  constructor(message, { status = 0, code = "", request } = {}) {
    super(message);
    this.name = "CountersignError";
    this.status = status;
    this.code = code;
    this.request = request; // the request as it now is, on a 409
  }
}

export class Countersign {
  constructor({ url = process.env.COUNTERSIGN_URL, apiKey = process.env.COUNTERSIGN_API_KEY, wait = "30s" } = {}) {
    if (!url || !apiKey) throw new CountersignError("set COUNTERSIGN_URL and COUNTERSIGN_API_KEY");
    this.url = url.replace(/\/+$/, "");
    this.apiKey = apiKey;
    this.wait = wait; // one long poll; Node's fetch drops a call silent for 300 s
  }

  async call(method, path, body) {
    let res;
    try {
      res = await fetch(this.url + path, {
        method,
        headers: { authorization: `Bearer ${this.apiKey}`, "content-type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (err) {
      throw new CountersignError(`Countersign at ${this.url} is unreachable: ${err.cause?.message ?? err.message}`);
    }
    const json = await res.json().catch(() => ({}));
    if (!res.ok) {
      const e = json.error ?? {};
      throw new CountersignError(`Countersign ${method} ${path}: ${res.status} ${e.code ?? ""} ${e.message ?? ""}`.trim(),
        { status: res.status, code: e.code ?? "", request: json.request });
    }
    return json;
  }

  /** request asks for approval of a call; the same callId returns the same request. */
  request({ tool, args, callId, runId, reason }) {
    return this.call("POST", "/v1/requests", { tool, arguments: args ?? {}, call_id: callId, run_id: runId, reason });
  }

  /** decision long-polls a request until it is final (or signal aborts). */
  async decision(r, signal) {
    while (r.status === "pending") {
      signal?.throwIfAborted();
      r = await this.call("GET", `/v1/requests/${encodeURIComponent(r.id)}?wait=${this.wait}`);
    }
    return r;
  }

  /** claim: exactly one claim of an approved request wins; a 409 means do not run. */
  claim(id) {
    return this.call("POST", `/v1/requests/${encodeURIComponent(id)}/claim`, {});
  }

  /** result reports what ran, with the winning claim's token. */
  result(id, token, status, output) {
    return this.call("POST", `/v1/requests/${encodeURIComponent(id)}/result`, { claim_token: token, status, output });
  }

  /** cancel withdraws a pending request (409 not_pending once decided). */
  cancel(id) {
    return this.call("POST", `/v1/requests/${encodeURIComponent(id)}/cancel`, {});
  }

  /** pending lists the key's own pending requests, oldest first. */
  async pending() {
    const out = [];
    let cursor = "";
    do {
      const page = await this.call("GET", `/v1/requests?status=pending&limit=100${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
      out.push(...page.requests);
      cursor = page.next_cursor ?? "";
    } while (cursor);
    return out;
  }
}

/** why says, for the model, why a final request did not run. */
export function why(r) {
  const who = r.approver_name || r.approver || "Countersign";
  switch (r.status) {
    case "rejected": return `Rejected by ${who}: ${r.reason || "no reason given"}`;
    case "responded": return `Not run; ${who} answered instead: ${r.response}`;
    case "expired": return "Not run: nobody decided before the deadline.";
    case "cancelled": return `Not run: ${r.reason || "cancelled"}`;
    default: return `Not run: the request is ${r.status}.`;
  }
}
