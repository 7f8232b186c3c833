package audit

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/cmd/countersign/config"
	"github.com/countersign/countersign/store/witness"
)

// readCheckpoints reads --pubkey and every --checkpoints file, merged.
func readCheckpoints(pubkey string, files []string) (ed25519.PublicKey, []approval.Checkpoint, error) {
	if pubkey == "" || len(files) == 0 {
		return nil, nil, errors.New("--pubkey and --checkpoints go together")
	}
	pub, err := config.ReadPublicKey(pubkey)
	if err != nil {
		return nil, nil, fmt.Errorf("--pubkey: %w", err)
	}
	var lists [][]approval.Checkpoint
	for _, f := range files {
		cps, err := witness.ReadFile(f)
		if err != nil {
			return nil, nil, fmt.Errorf("--checkpoints: %w", err)
		}
		lists = append(lists, cps)
	}
	return pub, approval.MergeCheckpoints(lists...), nil
}

// runAuditCheckpoint is `countersign audit checkpoint`: one checkpoint now,
// to the witnesses configured in the environment.
func runAuditCheckpoint(ctx context.Context, args []string, std config.Stdio) int {
	fs := flag.NewFlagSet("audit checkpoint", flag.ContinueOnError)
	fs.SetOutput(std.Stderr)
	nextKey := fs.String("next-key", "", "rotate: the new key's public key (file or base64); every later checkpoint must be signed by it")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintf(std.Stderr, "countersign audit checkpoint: %v\n", err)
		return 2
	}
	if err := errors.Join(cfg.CheckpointErrors()...); err != nil {
		fmt.Fprintf(std.Stderr, "countersign audit checkpoint: %v\n", err)
		return 2
	}
	if key, _ := cfg.SigningKey(); key == nil {
		fmt.Fprintln(std.Stderr, "countersign audit checkpoint: COUNTERSIGN_AUDIT_SIGNING_KEY or COUNTERSIGN_AUDIT_SIGNING_KEY_FILE: required")
		return 2
	}
	var next ed25519.PublicKey
	if *nextKey != "" {
		if next, err = config.ReadPublicKey(*nextKey); err != nil {
			fmt.Fprintf(std.Stderr, "countersign audit checkpoint: --next-key: %v\n", err)
			return 2
		}
	}
	log, where, closeLog, err := cfg.OpenAudit()
	if err != nil {
		fmt.Fprintf(std.Stderr, "countersign audit checkpoint: %v\n", err)
		return 2
	}
	defer closeLog()
	var messages bot.Messages
	if cfg.AuditWitnessChannel != "" {
		messages = bot.NewClient(bot.ClientOptions{APIURL: cfg.SlackAPIURL, BotToken: cfg.SlackBotToken,
			HTTPClient: &http.Client{Timeout: 30 * time.Second}})
	}
	logger := slog.New(slog.NewTextHandler(std.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cpr, err := cfg.Checkpointer(log, messages, time.Now, logger)
	if err != nil {
		fmt.Fprintf(std.Stderr, "countersign audit checkpoint: %v\n", err)
		return 2
	}
	var cp *approval.Checkpoint
	made := true
	if next != nil {
		cp, err = cpr.Rotate(ctx, next)
	} else {
		cp, made, err = cpr.Checkpoint(ctx)
	}
	switch {
	case err != nil:
		fmt.Fprintf(std.Stderr, "countersign audit checkpoint %s: %v\n", where, err)
		return 1
	case cp == nil:
		fmt.Fprintf(std.Stdout, "nothing to checkpoint: the audit stream %s is empty\n", where)
	case !made:
		fmt.Fprintf(std.Stdout, "already covered: the last checkpoint (seq %d, signed %s) covers the whole stream\n", cp.Seq, cp.Time.Format(time.RFC3339))
	default:
		fmt.Fprintf(std.Stdout, "checkpoint signed: seq %d, head %s, key %s", cp.Seq, approval.ShortHash(cp.Head), cp.KeyID)
		if cp.NextKey != "" {
			fmt.Fprintf(std.Stdout, ", next key %s", approval.KeyID(next))
		}
		fmt.Fprintln(std.Stdout)
	}
	return 0
}

// runAuditKeygen is `countersign audit keygen --out <file>`.
func runAuditKeygen(args []string, std config.Stdio) int {
	fs := flag.NewFlagSet("audit keygen", flag.ContinueOnError)
	fs.SetOutput(std.Stderr)
	out := fs.String("out", "", "file to write the private key to (base64 seed, mode 0600; never overwritten)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *out == "" || fs.NArg() > 0 {
		fmt.Fprintln(std.Stderr, "usage: countersign audit keygen --out <file>")
		return 2
	}
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		fmt.Fprintf(std.Stderr, "countersign audit keygen: %v\n", err)
		return 2
	}
	f, err := os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		fmt.Fprintf(std.Stderr, "countersign audit keygen: %v\n", err)
		return 2
	}
	_, werr := fmt.Fprintln(f, base64.StdEncoding.EncodeToString(key.Seed()))
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		fmt.Fprintf(std.Stderr, "countersign audit keygen: %v\n", err)
		return 2
	}
	fmt.Fprintln(std.Stdout, approval.EncodePublicKey(pub))
	fmt.Fprintf(std.Stderr, "private key (key id %s) written to %s; the public key above verifies its checkpoints\n", approval.KeyID(pub), *out)
	return 0
}
