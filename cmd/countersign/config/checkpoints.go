package config

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/witness"
)

// SigningKey reads the audit signing key from COUNTERSIGN_AUDIT_SIGNING_KEY
// or the file COUNTERSIGN_AUDIT_SIGNING_KEY_FILE names; nil when neither is
// set. Errors name the variable.
func (c Config) SigningKey() (ed25519.PrivateKey, error) {
	switch {
	case c.AuditSigningKey != "" && c.AuditSigningKeyFile != "":
		return nil, errors.New("COUNTERSIGN_AUDIT_SIGNING_KEY and COUNTERSIGN_AUDIT_SIGNING_KEY_FILE: set one, not both")
	case c.AuditSigningKey != "":
		key, err := approval.ParsePrivateKey(c.AuditSigningKey)
		if err != nil {
			return nil, fmt.Errorf("COUNTERSIGN_AUDIT_SIGNING_KEY: %w (make one with countersign audit keygen)", err)
		}
		return key, nil
	case c.AuditSigningKeyFile != "":
		b, err := os.ReadFile(c.AuditSigningKeyFile)
		if err != nil {
			return nil, fmt.Errorf("COUNTERSIGN_AUDIT_SIGNING_KEY_FILE: %w", err)
		}
		key, err := approval.ParsePrivateKey(string(b))
		if err != nil {
			return nil, fmt.Errorf("COUNTERSIGN_AUDIT_SIGNING_KEY_FILE %s: %w (make one with countersign audit keygen)", c.AuditSigningKeyFile, err)
		}
		return key, nil
	}
	return nil, nil
}

// CheckpointErrors checks the checkpoint settings; each error names its
// variable.
func (c Config) CheckpointErrors() []error {
	var errs []error
	if _, err := c.SigningKey(); err != nil {
		errs = append(errs, err)
	}
	if c.AuditCheckpointEvery < 1 {
		errs = append(errs, fmt.Errorf("COUNTERSIGN_AUDIT_CHECKPOINT_EVERY: must be at least 1, got %d", c.AuditCheckpointEvery))
	}
	if c.AuditCheckpointInterval <= 0 {
		errs = append(errs, fmt.Errorf("COUNTERSIGN_AUDIT_CHECKPOINT_INTERVAL: must be positive, got %s", c.AuditCheckpointInterval))
	}
	if c.AuditWitnessURL != "" {
		if u, err := url.Parse(c.AuditWitnessURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			errs = append(errs, fmt.Errorf("COUNTERSIGN_AUDIT_WITNESS_URL: not an http(s) URL: %q", c.AuditWitnessURL))
		}
		if c.AuditWitnessSecret == "" {
			errs = append(errs, errors.New("COUNTERSIGN_AUDIT_WITNESS_SECRET: required with COUNTERSIGN_AUDIT_WITNESS_URL (the checkpoint webhook is signed)"))
		}
	}
	if c.AuditPreviousPublicKey != "" {
		if _, err := ReadPublicKey(c.AuditPreviousPublicKey); err != nil {
			errs = append(errs, fmt.Errorf("COUNTERSIGN_AUDIT_PREVIOUS_PUBLIC_KEY: %w", err))
		}
	}
	if c.AuditWitnessChannel != "" && strings.HasPrefix(c.AuditWitnessChannel, "#") {
		errs = append(errs, fmt.Errorf("COUNTERSIGN_AUDIT_WITNESS_CHANNEL: a channel id (C…), not a name: %q", c.AuditWitnessChannel))
	}
	return errs
}

// witnesses builds the configured checkpoint witnesses; messages posts
// the Slack one (nil: no Slack witness). record is the file witness, read
// back at start (nil without one).
func (c Config) witnesses(messages bot.Messages) (ws []store.Witness, record store.WitnessLog) {
	if c.AuditWitnessFile != "" {
		f := &witness.File{Path: c.AuditWitnessFile}
		ws, record = append(ws, f), f
	}
	if c.AuditWitnessURL != "" {
		ws = append(ws, &witness.Webhook{URL: c.AuditWitnessURL, Sign: func(now time.Time, body []byte, delivery string) http.Header {
			// Signed as the API's webhooks are: one receiver checks both alike.
			return client.SignedHeaders([]byte(c.AuditWitnessSecret), now, body, delivery)
		}})
	}
	if c.AuditWitnessChannel != "" && messages != nil {
		ws = append(ws, &witness.Slack{Poster: bot.WitnessPoster{Messages: messages}, Channel: c.AuditWitnessChannel})
	}
	return ws, record
}

// Checkpointer builds the audit checkpointer (nil when no key is set) and
// says loudly at start what it proves: nothing without a witness. Its
// alarms go to the witness channel when there is one.
func (c Config) Checkpointer(a *store.Audit, messages bot.Messages, now func() time.Time, log *slog.Logger) (*store.Checkpointer, error) {
	key, err := c.SigningKey()
	if err != nil || key == nil {
		if err == nil {
			log.Warn("audit checkpoints off (no COUNTERSIGN_AUDIT_SIGNING_KEY): anyone with write access to Redis can rewrite the audit trail undetected; see docs/operations.md \"Threat model\"")
		}
		return nil, err
	}
	var prev ed25519.PublicKey
	if c.AuditPreviousPublicKey != "" {
		if prev, err = ReadPublicKey(c.AuditPreviousPublicKey); err != nil {
			return nil, fmt.Errorf("COUNTERSIGN_AUDIT_PREVIOUS_PUBLIC_KEY: %w", err)
		}
	}
	ws, record := c.witnesses(messages)
	if len(ws) == 0 {
		log.Error("audit checkpoints are signed but NO WITNESS is configured: they stay in Redis and prove nothing; set COUNTERSIGN_AUDIT_WITNESS_FILE, _URL or _CHANNEL (docs/operations.md \"Threat model\")")
	}
	var alarms store.Alarms
	if c.AuditWitnessChannel != "" && messages != nil {
		alarms = &witness.SlackAlarms{Poster: bot.WitnessPoster{Messages: messages}, Channel: c.AuditWitnessChannel}
	}
	names := make([]string, len(ws))
	for i, w := range ws {
		names[i] = w.Name()
	}
	log.Info("audit checkpoints on", "key_id", approval.KeyID(key.Public().(ed25519.PublicKey)), "every", c.AuditCheckpointEvery,
		"interval", c.AuditCheckpointInterval.String(), "alarm_after", approval.CheckpointBound(c.AuditCheckpointInterval).String(), "witnesses", names)
	return store.NewCheckpointer(a, store.CheckpointOptions{Key: key, PreviousKey: prev, Witnesses: ws, Record: record, Alarms: alarms,
		Every: c.AuditCheckpointEvery, Interval: c.AuditCheckpointInterval, Now: now, Logger: log.With("component", "checkpoints")}), nil
}

// ReadPublicKey reads a public key given as base64 or as a file holding it.
func ReadPublicKey(arg string) (ed25519.PublicKey, error) {
	if pub, err := approval.ParsePublicKey(arg); err == nil {
		return pub, nil
	}
	b, err := os.ReadFile(arg)
	if err != nil {
		return nil, fmt.Errorf("neither a base64 Ed25519 public key nor a readable file: %w", err)
	}
	pub, err := approval.ParsePublicKey(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", arg, err)
	}
	return pub, nil
}

// OpenAudit connects to the audit stream named by the environment and
// says which it is ("countersign:{audit} at redis://…"); close closes the
// connection.
func (c Config) OpenAudit() (a *store.Audit, where string, close func(), err error) {
	rdb, err := store.Dial(c.RedisURL)
	if err != nil {
		return nil, "", nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	where = fmt.Sprintf("%q at %s", c.AuditStream, store.RedactURL(c.RedisURL))
	return store.NewAudit(rdb, store.AuditOptions{Stream: c.AuditStream}), where, func() { _ = rdb.Close() }, nil
}
