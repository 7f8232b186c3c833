#!/usr/bin/env python3
"""Ask Countersign before a risky tool call, from any Python agent.

Standard library only. The native HTTP API is described in docs/api.md
(OpenAPI 3.1 at /v1/openapi.json).

    export COUNTERSIGN_URL=http://localhost:8080 COUNTERSIGN_API_KEY=csk_...
    python3 examples/api_client.py --tool deploy_service --call-id deploy-42 \
        --args '{"service": "web", "version": "1.4.2"}' --reason "the login fix is merged"

It asks, waits (long polls) until a person decides in Slack, "runs" the call
with the approved arguments when approved, reports the result, and prints
one line: the final status and who decided.
"""

import argparse
import hashlib
import hmac
import json
import os
import sys
import time
import urllib.error
import urllib.request


class CountersignError(Exception):
    """A refusal from the API: HTTP status, code, message and field."""

    def __init__(self, status, error):
        self.status = status
        self.code = error.get("code", "http_error")
        self.field = error.get("field", "")
        super().__init__(f"{status} {self.code}: {error.get('message', '')}"
                         + (f" (field {self.field})" if self.field else ""))


class Client:
    """A client of one Countersign server with one API key."""

    def __init__(self, base_url, key, poll_wait="30s"):
        self.base_url = base_url.rstrip("/")
        self.key = key
        self.poll_wait = poll_wait

    def _call(self, method, path, body=None, timeout=90):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self.key)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as e:
            try:
                error = json.load(e).get("error", {})
            except ValueError:
                error = {"message": str(e)}
            raise CountersignError(e.code, error) from None

    def request(self, tool, arguments, call_id, run_id="", reason="", confidence=None, facts=None):
        """Ask for approval. The same call_id always returns the same request."""
        body = {"tool": tool, "arguments": arguments, "call_id": call_id}
        if run_id:
            body["run_id"] = run_id
        if reason:
            body["reason"] = reason
        if confidence is not None:
            body["confidence"] = confidence
        if facts:
            body["facts"] = [{"label": k, "value": v} for k, v in facts.items()]
        return self._call("POST", "/v1/requests", body)

    def wait(self, request_id, deadline=None):
        """Long-poll until the request is final (or the deadline, in seconds since the epoch)."""
        while True:
            r = self._call("GET", f"/v1/requests/{request_id}?wait={self.poll_wait}")
            if r["status"] != "pending":
                return r
            if deadline is not None and time.time() > deadline:
                return r

    def claim(self, request_id):
        """Claim an approved request before running it. Every claim is judged against the policy
        in force. Exactly one claim wins: it returns {"claim_token": ..., "request": ...}; any
        other raises CountersignError with code "refused" (the policy in force refuses it: never
        run it; the message says why), "needs_approvals" (pending again for more approvals: wait,
        then claim again; claim_when_ready does both), "already_claimed" (another executor runs
        it: do not), "abandoned" or "not_approved"."""
        return self._call("POST", f"/v1/requests/{request_id}/claim", {})

    def claim_when_ready(self, request_id):
        """claim, waiting for the rest of the approvals whenever the policy in force asks more."""
        while True:
            try:
                return self.claim(request_id)
            except CountersignError as e:
                if e.code != "needs_approvals":
                    raise
                r = self.wait(request_id)
                if r["status"] != "approved":
                    raise CountersignError(409, {"code": "not_approved", "message": f"not approved: {r['status']}"})

    def result(self, request_id, claim_token, status, output):
        """Report what came of a claimed request: "executed" or "failed". Once, with the claim's token."""
        return self._call("POST", f"/v1/requests/{request_id}/result",
                          {"claim_token": claim_token, "status": status, "output": output})


def verify_webhook(secret, headers, body, now=None, tolerance=300):
    """Check a webhook delivery's signature over the raw body; return the event or raise ValueError."""
    ts = headers.get("X-Countersign-Request-Timestamp", "")
    if not ts.isdigit() or abs((now or time.time()) - int(ts)) > tolerance:
        raise ValueError("webhook timestamp missing or too far from now")
    mac = hmac.new(secret, b"v0:" + ts.encode() + b":" + body, hashlib.sha256)
    if not hmac.compare_digest("v0=" + mac.hexdigest(), headers.get("X-Countersign-Signature", "")):
        raise ValueError("webhook signature invalid")
    return json.loads(body)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tool", required=True)
    p.add_argument("--call-id", required=True)
    p.add_argument("--args", default="{}", help="the call's arguments, a JSON object")
    p.add_argument("--reason", default="")
    a = p.parse_args()

    c = Client(os.environ.get("COUNTERSIGN_URL", "http://localhost:8080"), os.environ["COUNTERSIGN_API_KEY"])
    r = c.request(a.tool, json.loads(a.args), a.call_id, run_id="python-example", reason=a.reason)
    if r["status"] == "pending":
        print(f"waiting for approval of {a.tool} (request {r['id']})", file=sys.stderr)
        r = c.wait(r["id"])
    if r["status"] == "approved":
        token = None
        if r.get("id"):
            claim = c.claim_when_ready(r["id"])  # raises on 409: refused, another executor has it, or it may not run
            token, r = claim["claim_token"], claim["request"]
        args = r["arguments"]  # the approved arguments: an approver may have edited them
        output = f"ran {a.tool} with {json.dumps(args, sort_keys=True)}"
        if token:
            r = c.result(r["id"], token, "executed", output)
    who = r.get("approver") or ("policy" if r.get("auto_approved") else "nobody")
    print(f"{r['status']} by {who}" + (f": {r['reason']}" if r.get("reason") else ""))


if __name__ == "__main__":
    main()
