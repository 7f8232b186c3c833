package approval_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
)

// chainOf signs n checkpoints of stream "s", each covering two entries.
func chainOf(t *testing.T, key ed25519.PrivateKey, n int) []approval.Checkpoint {
	t.Helper()
	var out []approval.Checkpoint
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	prev := ""
	for i := range n {
		hashes := []string{strings.Repeat("a", 16), strings.Repeat("b", 16)}
		c := approval.SignCheckpoint(key, approval.Checkpoint{Stream: "s", From: int64(2*i + 1), Seq: int64(2*i + 2),
			Head: strings.Repeat("c", 64), Hashes: hashes, Covered: approval.CoveredDigest(hashes), First: 1,
			Time: at.Add(time.Duration(i) * time.Minute), Prev: prev})
		prev = c.Hash()
		out = append(out, c)
	}
	return out
}

func TestVerifyCheckpoints(t *testing.T) {
	pub, key, _ := ed25519.GenerateKey(nil)
	_, other, _ := ed25519.GenerateKey(nil)
	tests := []struct {
		name   string
		edit   func([]approval.Checkpoint) []approval.Checkpoint
		stream string
		want   error
		why    string
	}{
		{"intact", func(c []approval.Checkpoint) []approval.Checkpoint { return c }, "s", nil, ""},
		{"edited head", func(c []approval.Checkpoint) []approval.Checkpoint { c[1].Head = strings.Repeat("d", 64); return c },
			"s", approval.ErrCheckpointSignature, "does not match its content"},
		{"signed by another key", func(c []approval.Checkpoint) []approval.Checkpoint {
			c[2] = approval.SignCheckpoint(other, c[2])
			return c
		}, "s", approval.ErrCheckpointSignature, "signed by key"},
		{"one missing", func(c []approval.Checkpoint) []approval.Checkpoint { return append(c[:1], c[2:]...) },
			"s", approval.ErrCheckpointChain, "a checkpoint is missing or forged"},
		{"other stream", func(c []approval.Checkpoint) []approval.Checkpoint { return c }, "t", approval.ErrCheckpointChain, `not "t"`},
		{"hashes edited", func(c []approval.Checkpoint) []approval.Checkpoint {
			c[0].Hashes[1] = strings.Repeat("e", 16)
			return c
		},
			"s", approval.ErrCheckpointChain, "do not match its signed digest"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := approval.VerifyCheckpoints(pub, tt.stream, tt.edit(chainOf(t, key, 3)))
			if !errors.Is(err, tt.want) || (err != nil && !strings.Contains(err.Error(), tt.why)) {
				t.Errorf("VerifyCheckpoints = %v, want %v (%q)", err, tt.want, tt.why)
			}
		})
	}
}

func TestMergeCheckpoints(t *testing.T) {
	pub, key, _ := ed25519.GenerateKey(nil)
	c := chainOf(t, key, 3)
	got := approval.MergeCheckpoints([]approval.Checkpoint{c[2], c[0]}, []approval.Checkpoint{c[1], c[0]})
	if len(got) != 3 {
		t.Fatalf("MergeCheckpoints = %d checkpoints, want 3", len(got))
	}
	if err := approval.VerifyCheckpoints(pub, "s", got); err != nil {
		t.Errorf("VerifyCheckpoints(merged) = %v", err)
	}
}

func TestParseKeys(t *testing.T) {
	pub, key, _ := ed25519.GenerateKey(nil)
	for _, s := range []string{base64.StdEncoding.EncodeToString(key.Seed()), base64.StdEncoding.EncodeToString(key) + "\n"} {
		got, err := approval.ParsePrivateKey(s)
		if err != nil || !got.Equal(key) {
			t.Errorf("ParsePrivateKey(%d chars) = %v", len(s), err)
		}
	}
	for _, bad := range []string{"", "not base64!", base64.StdEncoding.EncodeToString([]byte("short"))} {
		if _, err := approval.ParsePrivateKey(bad); err == nil {
			t.Errorf("ParsePrivateKey(%q) = nil error", bad)
		}
	}
	if got, err := approval.ParsePublicKey(approval.EncodePublicKey(pub)); err != nil || !got.Equal(pub) {
		t.Errorf("ParsePublicKey = %v", err)
	}
}
