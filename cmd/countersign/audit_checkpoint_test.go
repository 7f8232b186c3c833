package main_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
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

// TestAuditVerifyNotProven: entries older than the bound (the interval +
// 30 s) that no checkpoint covers mean checkpoints stopped: `audit verify
// --pubkey --checkpoints` says NOT PROVEN and exits 1; younger ones are
// only "not yet covered".
func TestAuditVerifyNotProven(t *testing.T) {
	tests := []struct {
		name     string
		interval string // COUNTERSIGN_AUDIT_CHECKPOINT_INTERVAL; "" the default, 1m
		age      time.Duration
		proven   bool
	}{
		{"4 entries an hour old", "", time.Hour, false},
		{"4 entries 10 s old", "", 10 * time.Second, true},
		{"4 entries 80 s old, interval 1m", "", 80 * time.Second, true},
		{"4 entries 40 s old, interval 3s", "3s", 40 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := mustAuditEnv(t)
			keyFile, pub := mustKeygen(t)
			witnessFile := filepath.Join(t.TempDir(), "checkpoints.jsonl")
			t.Setenv("COUNTERSIGN_AUDIT_SIGNING_KEY_FILE", keyFile)
			t.Setenv("COUNTERSIGN_AUDIT_WITNESS_FILE", witnessFile)
			if tt.interval != "" {
				t.Setenv("COUNTERSIGN_AUDIT_CHECKPOINT_INTERVAL", tt.interval)
			}
			at := time.Now().UTC().Add(-2 * time.Hour)
			for i := range 8 {
				env.append(t, at.Add(time.Duration(i)*time.Second), approval.Record{Event: approval.EventProposed, RequestID: "req_a", Tool: "refund"})
			}
			if code, out, errOut := runCLI(t.Context(), "audit", "checkpoint"); code != 0 {
				t.Fatalf("audit checkpoint = %d, %q, %q", code, out, errOut)
			}
			// Checkpoints stop (the attack: a lock with no expiry, on the
			// old checkpointer); the server goes on writing.
			written := time.Now().UTC().Add(-tt.age)
			for i := range 4 {
				env.append(t, written.Add(time.Duration(i)*time.Millisecond), approval.Record{Event: approval.EventDecided, RequestID: "req_a", Tool: "refund", Actor: "U0BOB0001"})
			}
			verify := []string{"audit", "verify", "--pubkey", pub, "--checkpoints", witnessFile}
			code, out, errOut := runCLI(t.Context(), verify...)
			if tt.proven {
				if code != 0 || !strings.Contains(out, "audit proven: 8 entries up to seq 8 by 1 checkpoint") || !strings.Contains(out, "4 after it not yet covered") {
					t.Errorf("audit verify = %d, %q, %q; want proven, 4 not yet covered", code, out, errOut)
				}
				return
			}
			if code != 1 || !strings.Contains(out, "audit NOT PROVEN: 4 entries after the last checkpoint (seq 8") || !strings.Contains(out, "from seq 9") {
				t.Errorf("audit verify = %d, %q, %q; want 1, NOT PROVEN from seq 9", code, out, errOut)
			}
			code, out, _ = runCLI(t.Context(), append(verify, "--json")...)
			var res auditreport.CheckpointedResult
			if err := json.Unmarshal([]byte(out), &res); err != nil || code != 1 || res.Proven || res.Overdue != 4 || res.Entry == nil || res.Entry.Seq != 9 {
				t.Errorf("audit verify --json = %d, %q (%v); want 4 overdue from seq 9", code, out, err)
			}
		})
	}
}

// TestAuditCheckpointUnderAttack: `audit checkpoint` is not stopped by a
// lock written with no expiry (it takes it over and says so), and does not
// build on a checkpoint in Redis it cannot check (a forged one with
// seq 2^40 naming its key next): it refuses.
func TestAuditCheckpointUnderAttack(t *testing.T) {
	env := mustAuditEnv(t)
	keyFile, pub := mustKeygen(t)
	witnessFile := filepath.Join(t.TempDir(), "checkpoints.jsonl")
	t.Setenv("COUNTERSIGN_AUDIT_SIGNING_KEY_FILE", keyFile)
	t.Setenv("COUNTERSIGN_AUDIT_WITNESS_FILE", witnessFile)
	at := time.Now().UTC().Add(-time.Minute)
	for i := range 3 {
		env.append(t, at.Add(time.Duration(i)*time.Second), approval.Record{Event: approval.EventProposed, RequestID: "req_a", Tool: "refund"})
	}
	attacker := storetest.Attacker{RDB: env.rdb, Stream: env.stream}
	attacker.HoldCheckpointLock(t, "mine")
	code, out, errOut := runCLI(t.Context(), "audit", "checkpoint")
	if code != 0 || !strings.Contains(out, "checkpoint signed: seq 3") || !strings.Contains(errOut, "lock taken over") {
		t.Errorf("audit checkpoint with the lock held for ever = %d, %q, %q; want it signed, the lock taken over", code, out, errOut)
	}

	attacker.SetCheckpoint(t, `{"stream":"`+env.stream+`","seq":1099511627776,"next_key":"`+pub+`"}`)
	env.append(t, time.Now().UTC(), approval.Record{Event: approval.EventProposed, RequestID: "req_b", Tool: "refund"})
	// A fresh process: no witness file to start from, only the forgery.
	t.Setenv("COUNTERSIGN_AUDIT_WITNESS_FILE", filepath.Join(t.TempDir(), "other.jsonl"))
	code, _, errOut = runCLI(t.Context(), "audit", "checkpoint")
	if code != 1 || !strings.Contains(errOut, "is refused") || !strings.Contains(errOut, "is unsigned") {
		t.Errorf("audit checkpoint over a forged checkpoint = %d, %q; want 1, refused", code, errOut)
	}
	// With its own witness file it builds on its last checkpoint instead.
	t.Setenv("COUNTERSIGN_AUDIT_WITNESS_FILE", witnessFile)
	if code, out, errOut := runCLI(t.Context(), "audit", "checkpoint"); code != 0 || !strings.Contains(out, "checkpoint signed: seq 4") {
		t.Errorf("audit checkpoint with its witness file = %d, %q, %q; want seq 4 signed", code, out, errOut)
	}
	if code, out, _ := runCLI(t.Context(), "audit", "verify", "--pubkey", pub, "--checkpoints", witnessFile); code != 0 || !strings.Contains(out, "audit proven: 4 entries up to seq 4 by 2 checkpoints") {
		t.Errorf("audit verify = %d, %q", code, out)
	}
}

// TestMainCheckpointAlarm: a process whose checkpointer refuses what Redis
// holds (here a forged checkpoint, seq 2^40, naming its key next) says so
// everywhere an operator looks: /readyz (degraded, still 200), the alarm
// gauge, and the ops channel.
func TestMainCheckpointAlarm(t *testing.T) {
	ws := slacksimtest.New(t, slacksim.Options{})
	ws.SeedDemo()
	policy, err := policyfile.Parse(demo.Policy)
	if err != nil {
		t.Fatal(err)
	}
	pub, key, _ := ed25519.GenerateKey(nil)
	rdb, prefix := storetest.New(t)
	stream := prefix + ":{audit}"
	storetest.Attacker{RDB: rdb, Stream: stream}.SetCheckpoint(t, `{"stream":"`+stream+`","seq":1099511627776,"next_key":"`+approval.EncodePublicKey(pub)+`"}`)
	m := &main.Main{Config: main.Config{SlackBotToken: "xoxb-sim", SlackAppToken: "xapp-sim",
		SlackAPIURL: ws.APIURL(), OpenAIAPIKey: "k", OpenAIBaseURL: "http://127.0.0.1:1/v1", OpenAIModel: "m",
		LogLevel: "warn", Addr: "127.0.0.1:0", RedisPrefix: prefix, AuditStream: stream,
		AuditSigningKey: approvalKey(key), AuditCheckpointEvery: 1000, AuditCheckpointInterval: time.Minute,
		AuditWitnessFile: filepath.Join(t.TempDir(), "checkpoints.jsonl"), AuditWitnessChannel: "G0APPROV1"},
		Policy: policy, Redis: rdb, Logger: slog.New(slog.DiscardHandler)}
	if err := m.Start(context.Background()); err != nil {
		_ = m.Close()
		t.Fatalf("Main.Start: %v", err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = m.Close()
		}
	}()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + m.Addr() + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	var posted string
	waitUntil(t, "the alarm in the ops channel", func() bool {
		for _, msg := range ws.Messages("G0APPROV1") {
			if strings.Contains(string(msg.Metadata), witness.SlackAlarmEventType) {
				posted = msg.Text
				return true
			}
		}
		return false
	})
	if !strings.Contains(posted, "is refused") {
		t.Errorf("ops channel alarm = %q, want the refusal", posted)
	}
	if code, body := get("/readyz"); code != http.StatusOK || !strings.Contains(body, "degraded: audit checkpoints: ") || !strings.Contains(body, "is refused") {
		t.Errorf("GET /readyz = %d, %q; want 200, degraded naming the refusal", code, body)
	}
	if _, body := get("/metrics"); !strings.Contains(body, "\ncountersign_audit_checkpoint_alarm 1\n") {
		t.Errorf("GET /metrics lacks countersign_audit_checkpoint_alarm 1")
	}
	// Nor is anything signed at shutdown: Close says why.
	closed = true
	if err := m.Close(); err == nil || !strings.Contains(err.Error(), "final audit checkpoint") || !strings.Contains(err.Error(), "is refused") {
		t.Errorf("Main.Close = %v, want the final checkpoint refused", err)
	}
}
