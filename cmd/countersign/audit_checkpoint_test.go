package main_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
	"github.com/countersign/countersign/store/storetest"
	"github.com/countersign/countersign/store/witness"
)

// mustKeygen runs `audit keygen` and returns the key file and the public key.
func mustKeygen(t *testing.T) (string, string) {
	t.Helper()
	keyFile := filepath.Join(t.TempDir(), "audit.key")
	code, out, errOut := runCLI(t.Context(), "audit", "keygen", "--out", keyFile)
	if code != 0 {
		t.Fatalf("audit keygen = %d, %q", code, errOut)
	}
	if code, _, _ := runCLI(t.Context(), "audit", "keygen", "--out", keyFile); code != 2 {
		t.Errorf("audit keygen over an existing file = %d, want 2 (never overwritten)", code)
	}
	return keyFile, strings.TrimSpace(out)
}

// TestAuditVerifyCheckpointsCLI is issue 29's attack through the command
// line: an approval's actor rewritten in Redis and every later entry
// hashed again passes `audit verify`, and `audit verify --pubkey
// --checkpoints` names the entry; the next checkpoint refuses to sign.
func TestAuditVerifyCheckpointsCLI(t *testing.T) {
	env := mustAuditEnv(t)
	keyFile, pub := mustKeygen(t)
	witnessFile := filepath.Join(t.TempDir(), "checkpoints.jsonl")
	t.Setenv("COUNTERSIGN_AUDIT_SIGNING_KEY_FILE", keyFile)
	t.Setenv("COUNTERSIGN_AUDIT_WITNESS_FILE", witnessFile)
	at := time.Now().UTC().Add(-time.Hour)
	for i := range 8 {
		r := approval.Record{Event: approval.EventProposed, RequestID: "req_a", Tool: "refund", Actor: "U0REQUEST1"}
		if i == 2 {
			r = approval.Record{Event: approval.EventDecided, RequestID: "req_a", Tool: "refund", Actor: "U0MALLORY1", Data: map[string]any{"verdict": "approve"}}
		}
		env.append(t, at.Add(time.Duration(i)*time.Second), r)
	}

	code, out, errOut := runCLI(t.Context(), "audit", "checkpoint")
	if code != 0 || !strings.Contains(out, "checkpoint signed: seq 8") {
		t.Fatalf("audit checkpoint = %d, %q, %q", code, out, errOut)
	}
	verify := []string{"audit", "verify", "--pubkey", pub, "--checkpoints", witnessFile}
	if code, out, errOut := runCLI(t.Context(), verify...); code != 0 || !strings.Contains(out, "audit proven: 8 entries up to seq 8 by 1 checkpoint") {
		t.Fatalf("audit verify with checkpoints = %d, %q, %q", code, out, errOut)
	}

	storetest.Attacker{RDB: env.rdb, Stream: env.stream}.Rewrite(t, 3, func(e *approval.Entry) { e.Actor = "U0EVE00001" })
	if code, out, _ := runCLI(t.Context(), "audit", "verify"); code != 0 {
		t.Fatalf("audit verify (keyless) after the rewrite = %d, %q; the attack passes it", code, out)
	}
	code, out, errOut = runCLI(t.Context(), verify...)
	if code != 1 || !strings.Contains(out, "audit BROKEN at seq 3") || !strings.Contains(out, "rewritten after it was signed") || !strings.Contains(out, "U0EVE00001") {
		t.Errorf("audit verify with checkpoints after the rewrite = %d, %q, %q; want 1 naming seq 3", code, out, errOut)
	}
	code, out, errOut = runCLI(t.Context(), append(verify, "--json")...)
	var res auditreport.CheckpointedResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 1 || res.Proven || res.Break == nil || res.Break.Seq != 3 {
		t.Errorf("audit verify --json = %d, %q (%v), %q; want the break at seq 3", code, out, err, errOut)
	}

	// The server goes on appending on the forged head: no checkpoint signs it.
	env.append(t, at.Add(time.Minute), approval.Record{Event: approval.EventExecuted, RequestID: "req_a", Tool: "refund"})
	if code, _, errOut := runCLI(t.Context(), "audit", "checkpoint"); code != 1 || !strings.Contains(errOut, "no longer extends the last signed checkpoint") {
		t.Errorf("audit checkpoint on a rewritten stream = %d, %q; want 1, refused", code, errOut)
	}

	// Flags that cannot work are refused before Redis is read.
	if code, _, errOut := runCLI(t.Context(), "audit", "verify", "--pubkey", "nope", "--checkpoints", witnessFile); code != 2 || !strings.Contains(errOut, "--pubkey") {
		t.Errorf("audit verify --pubkey nope = %d, %q", code, errOut)
	}
}

// TestAuditCheckpointSettings: each bad checkpoint setting names its variable.
func TestAuditCheckpointSettings(t *testing.T) {
	mustAuditEnv(t)
	for _, tc := range []struct{ name, value, want string }{
		{"COUNTERSIGN_AUDIT_SIGNING_KEY", "bm90IGEga2V5", "COUNTERSIGN_AUDIT_SIGNING_KEY: an Ed25519 key is a 32-byte seed"},
		{"COUNTERSIGN_AUDIT_SIGNING_KEY_FILE", "/nonexistent/key", "COUNTERSIGN_AUDIT_SIGNING_KEY_FILE: open /nonexistent/key"},
		{"COUNTERSIGN_AUDIT_WITNESS_URL", "ftp://x", "COUNTERSIGN_AUDIT_WITNESS_URL: not an http(s) URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(tc.name, tc.value)
			code, _, errOut := runCLI(t.Context(), "audit", "checkpoint")
			if code != 2 || !strings.Contains(errOut, tc.want) {
				t.Errorf("audit checkpoint with %s=%q = %d, %q; want 2 and %q", tc.name, tc.value, code, errOut, tc.want)
			}
		})
	}
}

// TestMainCheckpointsAtClose: a process with a signing key and witnesses
// covers its last entries at shutdown, in the file and in the ops channel.
func TestMainCheckpointsAtClose(t *testing.T) {
	ws := slacksimtest.New(t, slacksim.Options{})
	ws.SeedDemo()
	policy, err := policyfile.Parse(demo.Policy)
	if err != nil {
		t.Fatal(err)
	}
	pub, key, _ := ed25519.GenerateKey(nil)
	witnessFile := filepath.Join(t.TempDir(), "checkpoints.jsonl")
	rdb, prefix := storetest.New(t)
	m := &main.Main{Config: main.Config{SlackBotToken: "xoxb-sim", SlackAppToken: "xapp-sim",
		SlackAPIURL: ws.APIURL(), OpenAIAPIKey: "k", OpenAIBaseURL: "http://127.0.0.1:1/v1", OpenAIModel: "m",
		LogLevel: "warn", Addr: "127.0.0.1:0", RedisPrefix: prefix, AuditStream: prefix + ":{audit}",
		AuditSigningKey: approvalKey(key), AuditCheckpointEvery: 1000, AuditCheckpointInterval: time.Hour,
		AuditWitnessFile: witnessFile, AuditWitnessChannel: "G0APPROV1"},
		Policy: policy, Redis: rdb, Logger: slog.New(slog.DiscardHandler)}
	if err := m.Start(context.Background()); err != nil {
		_ = m.Close()
		t.Fatalf("Main.Start: %v", err)
	}
	for range 3 {
		if _, err := m.Audit.Append(t.Context(), approval.Record{Event: approval.EventProposed, Tool: "refund"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Main.Close: %v", err)
	}
	cps, err := witness.ReadFile(witnessFile)
	if err != nil || len(cps) != 1 || cps[0].Seq < 3 {
		t.Fatalf("witness file after Close = %+v, %v; want one checkpoint covering the entries", cps, err)
	}
	var out strings.Builder
	if ok, err := auditreport.VerifyCheckpointed(t.Context(), m.Audit, &out, auditreport.Proof{Stream: m.Config.AuditStream, PubKey: pub, Checkpoints: cps,
		Bound: approval.CheckpointBound(time.Hour), Now: time.Now()}, false); !ok || err != nil {
		t.Errorf("VerifyCheckpointed = %v, %v, %q", ok, err, out.String())
	}
	var posted bool
	for _, msg := range ws.Messages("G0APPROV1") {
		if strings.Contains(string(msg.Metadata), witness.SlackEventType) && strings.Contains(msg.Text, cps[0].Sig) {
			posted = true
		}
	}
	if !posted {
		t.Errorf("no checkpoint message in the ops channel: %+v", ws.Messages("G0APPROV1"))
	}
}

func approvalKey(key ed25519.PrivateKey) string {
	b, _ := json.Marshal([]byte(key.Seed())) // a JSON string of base64
	return strings.Trim(string(b), `"`)
}
