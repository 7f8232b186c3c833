// countersign.mjs: a small client for Countersign's HTTP API (/v1), with no
// dependencies (Node's fetch). Copy it next to your agent. The examples in
// langgraph/, vercel-ai/ and openai-agents/ use it; docs/api.md is the
// contract.
//
//   const cs = new Countersign();                 // COUNTERSIGN_URL, COUNTERSIGN_API_KEY
//   const r = await cs.ask({ tool, arguments: args, callId });   // waits for a person
//   if (r.status === "approved") output = await cs.run(r, args, (a) => myTool(a));
//   else tell the model cs.why(r);
//
// ask and run are request + decision and claim + result; a framework that
// pauses a run while a person decides (the OpenAI Agents SDK's
// interruptions) calls the four steps itself.
//
// Fail closed: every error (Countersign unreachable, a bad key, a refusal)
// throws; treat a throw as "do not run".

/** CountersignError is an error answer of the API (or no answer at all). */
export class CountersignError extends Error {
  constructor(message, { status = 0, code = "", request = undefined } = {}) {
    super(message);
    this.name = "CountersignError";
    this.status = status;
    this.code = code;
    this.request = request;
  }
}

/** Countersign asks, waits, claims and reports through /v1. */
export class Countersign {
  constructor({
    url = process.env.COUNTERSIGN_URL,
    apiKey = process.env.COUNTERSIGN_API_KEY,
    wait = "30s", // each long poll; undici drops a call silent for 300 s
  } = {}) {
    if (!url || !apiKey) {
      throw new CountersignError("set COUNTERSIGN_URL and COUNTERSIGN_API_KEY (countersign demo prints both)");
    }
    this.url = url.replace(/\/+$/, "");
    this.apiKey = apiKey;
    this.wait = wait;
  }

  async #call(method, path, body) {
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
      throw new CountersignError(`Countersign ${method} ${path}: ${res.status} ${e.code ?? ""} ${e.message ?? ""}`.trim(), {
        status: res.status,
        code: e.code ?? "",
        request: json.request, // the request as it now is, on a 409
      });
    }
    return json;
  }

  /**
   * ask proposes a tool call and waits (long polls) until it is final:
   * approved, rejected, responded, expired, cancelled or abandoned. callId
   * must be unique per call and stable across retries (a retry returns the
   * same request, never a second card).
   */
  async ask({ tool, arguments: args, callId, runId, reason, facts }) {
    return this.decision(await this.request({ tool, arguments: args, callId, runId, reason, facts }));
  }

  /** request proposes a call without waiting; the same callId returns the same request. */
  request({ tool, arguments: args, callId, runId, reason, facts }) {
    return this.#call("POST", "/v1/requests", {
      tool,
      arguments: args ?? {},
      call_id: callId,
      run_id: runId,
      reason,
      facts,
    });
  }

  /** decision long-polls request r until it is final (or signal aborts). */
  async decision(r, signal) {
    while (r.status === "pending") {
      signal?.throwIfAborted();
      r = await this.#call("GET", `/v1/requests/${encodeURIComponent(r.id)}?wait=${this.wait}`);
    }
    return r;
  }

  /**
   * run claims an approved request, runs fn with the arguments the approver
   * approved (an edit changes them), reports the outcome and returns fn's
   * answer. A request approved by policy alone (no id) needs no claim: fn
   * runs with args. Every claim is judged against the policy in force: one
   * that needs more approvals waits for them (claimWhenReady); one refused
   * (409: the policy in force refuses it, another executor won, or the
   * claim window passed) throws with why and fn does not run.
   */
  async run(request, args, fn) {
    if (request.status !== "approved") {
      throw new CountersignError(`not approved: ${this.why(request)}`, { request });
    }
    if (!request.id) return fn(args);
    const claim = await this.claimWhenReady(request.id);
    const approved = claim.request?.arguments ?? request.arguments ?? args;
    let output;
    try {
      output = await fn(approved);
    } catch (err) {
      await this.result(request.id, claim.claim_token, "failed", String(err?.message ?? err));
      throw err;
    }
    await this.result(request.id, claim.claim_token, "executed", typeof output === "string" ? output : JSON.stringify(output));
    return output;
  }

  /** claim: exactly one claim of an approved request wins; a 409 means do not run. */
  claim(id) {
    return this.#call("POST", `/v1/requests/${encodeURIComponent(id)}/claim`, {});
  }

  /**
   * claimWhenReady claims request id; when the policy in force asks more
   * approvals of it (409 needs_approvals: it is pending again, its card
   * asking for the rest) it waits for them and claims again. Any other
   * refusal throws (refused: the policy in force refuses it; never run it).
   */
  async claimWhenReady(id, signal) {
    for (;;) {
      try {
        return await this.claim(id);
      } catch (err) {
        if (!(err instanceof CountersignError) || err.code !== "needs_approvals") throw err;
        const r = await this.decision(err.request ?? { id, status: "pending" }, signal);
        if (r.status !== "approved") {
          throw new CountersignError(`not approved: ${this.why(r)}`, { status: 409, code: "not_approved", request: r });
        }
      }
    }
  }

  /** result reports what ran, with the winning claim's token. */
  result(id, token, status, output) {
    return this.#call("POST", `/v1/requests/${encodeURIComponent(id)}/result`, {
      claim_token: token,
      status,
      output: String(output ?? "").slice(0, 4000),
    });
  }

  /** cancel withdraws a pending request (409 not_pending once decided). */
  cancel(id) {
    return this.#call("POST", `/v1/requests/${encodeURIComponent(id)}/cancel`, {});
  }

  /** pending lists the key's own pending requests, oldest first. */
  async pending() {
    const out = [];
    let cursor = "";
    do {
      const page = await this.#call("GET", `/v1/requests?status=pending&limit=100${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
      out.push(...page.requests);
      cursor = page.next_cursor ?? "";
    } while (cursor);
    return out;
  }

  /** why is the sentence for the model when a request is not approved. */
  why(r) {
    return why(r);
  }
}

/** why is the sentence for the model when request r did not run. */
export function why(r) {
  const who = r.approver_name || r.approver || "the approver";
  switch (r.status) {
    case "rejected":
      return `Rejected by ${who}${r.reason ? `: ${r.reason}` : ""}. Do not retry this call as it was.`;
    case "responded":
      return `${who} answered instead of running the tool: ${r.response ?? ""}`;
    case "expired":
      return "Nobody decided in time; the call did not run.";
    case "cancelled":
      return `The request was withdrawn${r.reason ? ` (${r.reason})` : ""}; the call did not run.`;
    case "abandoned":
      return "The approval was not claimed in time; the call did not run.";
    case "refused":
      return `Approved, but Countersign refused it when it was to run: ${r.reason ?? "the policy in force refuses it"}. Do not retry this call as it was.`;
    default:
      return r.reason || `The call did not run (status ${r.status}).`;
  }
}
