// The official MCP TypeScript SDK client against Countersign's /mcp, run by
// cmd/countersign's tests with Node 22 (mcp_node_e2e_test.go).
//
//   node client.mjs call URL KEY TOOL ARGS_JSON   one tools/call, no progress token
//   node client.mjs connect URL KEY               connect only
//
// Node's own fetch is used, as by any Node MCP client, with undici's global
// dispatcher waiting at most 2 s for response headers: it stands in for
// undici's default of 300 s, after which a held call that sends nothing is
// dropped. An OAuth provider is given, as MCP Inspector and Claude Code
// give one: it records whether the SDK started an OAuth flow.
// The last line printed is one JSON object: {ok, result|error, oauth}.
import { Agent, setGlobalDispatcher } from "undici";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

setGlobalDispatcher(new Agent({ headersTimeout: 2000 }));

const [mode, url, key, tool, args] = process.argv.slice(2);
const oauth = [];
const authProvider = {
  get redirectUrl() { return "http://127.0.0.1:1/callback"; },
  get clientMetadata() { return { redirect_uris: ["http://127.0.0.1:1/callback"], client_name: "countersign-test" }; },
  clientInformation() { oauth.push("clientInformation"); return undefined; },
  saveClientInformation() { oauth.push("saveClientInformation"); },
  tokens() { return undefined; },
  saveTokens() { oauth.push("saveTokens"); },
  redirectToAuthorization() { oauth.push("redirectToAuthorization"); throw new Error("an OAuth flow was started"); },
  saveCodeVerifier() { oauth.push("saveCodeVerifier"); },
  codeVerifier() { oauth.push("codeVerifier"); return "v"; },
};

const transport = new StreamableHTTPClientTransport(new URL(url), {
  authProvider,
  requestInit: { headers: { Authorization: `Bearer ${key}` } },
});
const client = new Client({ name: "node-test-agent", version: "1" });
let out;
try {
  await client.connect(transport);
  if (mode === "call") {
    // No onprogress: no progress token, as most clients call. The SDK's own
    // 60 s request timeout is raised so that only fetch's limit is tested.
    const result = await client.callTool({ name: tool, arguments: JSON.parse(args) }, undefined, { timeout: 120000 });
    out = { ok: true, result };
  } else {
    out = { ok: true };
  }
} catch (err) {
  const cause = err?.cause ? ` (cause: ${err.cause.code ?? ""} ${err.cause.message ?? err.cause})` : "";
  out = { ok: false, error: `${err?.name}: ${err?.message}${cause}` };
}
out.oauth = oauth;
console.log(JSON.stringify(out));
await client.close().catch(() => {});
process.exit(0);
