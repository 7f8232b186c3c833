package approval

// This file: signed checkpoints of the audit chain. The chain itself
// (audit.go) is keyless: whoever can write to the store can rewrite an
// entry and hash everything after it again. A checkpoint is the chain's
// head signed with an Ed25519 key the store never holds and published to
// witnesses outside it, so a rewrite, a cut tail or a trimmed head of what
// a checkpoint covers no longer passes verification.

import (
	"bytes"
	"cmp"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Checkpoint is a signed statement about the audit stream: entries From to
// Seq were there, the entry at Seq (EntryID) had the hash Head, and the
// checkpoint before this one is Prev. Every field but Sig and Hashes is
// signed (SignedBytes).
type Checkpoint struct {
	// Stream is the audit stream's key.
	Stream string `json:"stream"`
	// Seq and EntryID name the newest entry covered; Head is its hash
	// (0, "" and "" for an empty stream).
	Seq     int64  `json:"seq"`
	EntryID string `json:"entry_id,omitempty"`
	Head    string `json:"head"`
	// From is the seq of the first entry this checkpoint covers: the
	// previous checkpoint's Seq + 1 (Seq + 1 when it covers none).
	From int64 `json:"from"`
	// Covered is CoveredDigest of the short hashes of entries From to Seq;
	// Hashes, when a witness keeps them, are those short hashes: they name
	// the first entry that differs.
	Covered string `json:"covered"`
	// First is the seq of the oldest entry the stream held when this was
	// signed (entries before it were trimmed by the writer); MaxLen is
	// the writer's trim length (0: it never trims).
	First  int64 `json:"first"`
	MaxLen int64 `json:"max_len,omitempty"`
	// Time is when the checkpoint was signed (UTC).
	Time time.Time `json:"time"`
	// Prev is the Hash of the checkpoint before this one, "" for the first.
	Prev string `json:"prev"`
	// KeyID names the key that signed (KeyID of its public key).
	KeyID string `json:"key_id"`
	// NextKey, set on a rotation, is the base64 public key that signs
	// every checkpoint after this one.
	NextKey string `json:"next_key,omitempty"`
	// Sig is the base64 Ed25519 signature of SignedBytes.
	Sig string `json:"sig"`
	// Hashes are ShortHash of each covered entry's hash, From to Seq; not
	// signed, checked against Covered.
	Hashes []string `json:"hashes,omitempty"`
}

// checkpointDomain separates a checkpoint's signature from any other use
// of the key.
const checkpointDomain = "countersign audit checkpoint v1\n"

// shortHashLen is how many hex digits of an entry's hash a checkpoint's
// Hashes keep: 64 bits name an entry; Head and the chain prove it.
const shortHashLen = 16

// Checkpoint errors, wrapped by *CheckpointError.
var (
	// ErrCheckpointSignature: a checkpoint is not signed by the trusted key.
	ErrCheckpointSignature = errors.New("checkpoint signature invalid")
	// ErrCheckpointChain: a checkpoint does not follow the one before it.
	ErrCheckpointChain = errors.New("checkpoint chain broken")
)

// CheckpointError names the first checkpoint that fails verification.
type CheckpointError struct {
	Index int   // position in the checkpoints, from 0
	Seq   int64 // the checkpoint's Seq
	Time  time.Time
	Why   string
	Err   error // ErrCheckpointSignature or ErrCheckpointChain
}

// Error says which checkpoint fails and why.
func (e *CheckpointError) Error() string {
	return fmt.Sprintf("checkpoint %d (seq %d, signed %s): %s: %s", e.Index+1, e.Seq,
		e.Time.UTC().Format(time.RFC3339), e.Err, e.Why)
}

// Unwrap returns the sentinel.
func (e *CheckpointError) Unwrap() error { return e.Err }

// KeyID names a public key: the first 16 hex digits of its SHA-256.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// ShortHash is the part of an entry hash a checkpoint's Hashes keep.
func ShortHash(hash string) string {
	if len(hash) > shortHashLen {
		return hash[:shortHashLen]
	}
	return hash
}

// CoveredDigest is the hex SHA-256 of short hashes, one a line.
func CoveredDigest(short []string) string {
	h := sha256.New()
	for _, s := range short {
		h.Write([]byte(s))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// SignedBytes is what the signature covers: every field but Sig and
// Hashes, as JSON in a fixed order, after a domain line.
func (c Checkpoint) SignedBytes() []byte {
	c.Sig, c.Hashes = "", nil
	c.Time = c.Time.UTC()
	b, err := json.Marshal(c)
	if err != nil {
		// A struct of strings, ints and a time: Marshal cannot fail.
		panic(fmt.Sprintf("marshal checkpoint: %v", err))
	}
	return append([]byte(checkpointDomain), b...)
}

// Hash is the hex SHA-256 of the signed bytes and the signature: what the
// next checkpoint's Prev holds.
func (c Checkpoint) Hash() string {
	h := sha256.New()
	h.Write(c.SignedBytes())
	h.Write([]byte(c.Sig))
	return hex.EncodeToString(h.Sum(nil))
}

// SignCheckpoint returns c signed with key (KeyID and Sig set, Time in UTC).
func SignCheckpoint(key ed25519.PrivateKey, c Checkpoint) Checkpoint {
	c.Time = c.Time.UTC()
	c.KeyID = KeyID(key.Public().(ed25519.PublicKey))
	c.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(key, c.SignedBytes()))
	return c
}

// CheckSignature reports whether c is signed by pub: an error wrapping
// ErrCheckpointSignature when it is not.
func (c Checkpoint) CheckSignature(pub ed25519.PublicKey) error {
	if c.KeyID != KeyID(pub) {
		return fmt.Errorf("%w: signed by key %s, expected %s", ErrCheckpointSignature, c.KeyID, KeyID(pub))
	}
	sig, err := base64.StdEncoding.DecodeString(c.Sig)
	if err != nil || !ed25519.Verify(pub, c.SignedBytes(), sig) {
		return fmt.Errorf("%w: the signature does not match its content", ErrCheckpointSignature)
	}
	return nil
}

// ParsePublicKey reads a base64 Ed25519 public key (32 bytes).
func ParsePublicKey(s string) (ed25519.PublicKey, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, errors.New("not a base64 Ed25519 public key (32 bytes)")
	}
	return ed25519.PublicKey(b), nil
}

// ParsePrivateKey reads a base64 Ed25519 private key: its 32-byte seed
// (what `countersign audit keygen` writes) or the 64-byte key.
func ParsePrivateKey(s string) (ed25519.PrivateKey, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	switch {
	case err != nil:
		return nil, errors.New("not base64")
	case len(b) == ed25519.SeedSize:
		return ed25519.NewKeyFromSeed(b), nil
	case len(b) == ed25519.PrivateKeySize:
		key := ed25519.PrivateKey(b)
		if !bytes.Equal(ed25519.NewKeyFromSeed(b[:ed25519.SeedSize]), key) {
			return nil, errors.New("not a consistent Ed25519 private key")
		}
		return key, nil
	}
	return nil, fmt.Errorf("an Ed25519 key is a %d-byte seed or a %d-byte key, got %d bytes", ed25519.SeedSize, ed25519.PrivateKeySize, len(b))
}

// EncodePublicKey is the base64 form ParsePublicKey reads.
func EncodePublicKey(pub ed25519.PublicKey) string {
	return base64.StdEncoding.EncodeToString(pub)
}

// VerifyCheckpoints checks, in order, that each checkpoint is signed by
// the trusted key (pub at first, then each rotation's NextKey), is about
// stream (when stream is not ""), and follows the one before it: its Prev
// is that one's Hash, its entries start right after that one's Seq, its
// time is not earlier, and its Hashes (when kept) match its signed digest.
// The first failure is a *CheckpointError.
func VerifyCheckpoints(pub ed25519.PublicKey, stream string, cps []Checkpoint) error {
	key := pub
	for i, c := range cps {
		fail := func(sentinel error, format string, args ...any) error {
			return &CheckpointError{Index: i, Seq: c.Seq, Time: c.Time, Err: sentinel, Why: fmt.Sprintf(format, args...)}
		}
		if err := c.CheckSignature(key); err != nil {
			return fail(ErrCheckpointSignature, "%s", strings.TrimPrefix(err.Error(), ErrCheckpointSignature.Error()+": "))
		}
		if stream != "" && c.Stream != stream {
			return fail(ErrCheckpointChain, "it is about stream %q, not %q", c.Stream, stream)
		}
		if c.Seq < 0 || c.From < 1 || c.From > c.Seq+1 {
			return fail(ErrCheckpointChain, "it covers seq %d to %d", c.From, c.Seq)
		}
		if len(c.Hashes) > 0 {
			if int64(len(c.Hashes)) != c.Seq-c.From+1 || CoveredDigest(c.Hashes) != c.Covered {
				return fail(ErrCheckpointChain, "its entry hashes do not match its signed digest")
			}
		}
		if i > 0 {
			p := cps[i-1]
			switch {
			case c.Prev != p.Hash():
				return fail(ErrCheckpointChain, "it does not name the checkpoint before it (seq %d) as its previous one: a checkpoint is missing or forged", p.Seq)
			case c.From != p.Seq+1:
				return fail(ErrCheckpointChain, "it covers from seq %d but the checkpoint before it ends at seq %d", c.From, p.Seq)
			case c.Time.Before(p.Time):
				return fail(ErrCheckpointChain, "it is signed before the checkpoint before it (%s)", p.Time.UTC().Format(time.RFC3339))
			}
		}
		if c.NextKey != "" {
			next, err := ParsePublicKey(c.NextKey)
			if err != nil {
				return fail(ErrCheckpointChain, "next_key: %v", err)
			}
			key = next
		}
	}
	return nil
}

// CheckpointGrace is what a checkpoint may take beyond the interval:
// the look every second, signing, and the witnesses' answers.
const CheckpointGrace = 30 * time.Second

// CheckpointBound is how long an entry may wait for a checkpoint when
// checkpoints follow within interval: interval plus CheckpointGrace. An
// entry older than that which no checkpoint covers means checkpoints have
// stopped: the checkpointer raises an alarm, and `audit verify
// --checkpoints` says NOT PROVEN.
func CheckpointBound(interval time.Duration) time.Duration {
	return interval + CheckpointGrace
}

// CheckpointHealth is how a checkpointer is doing, as the metrics and
// /readyz show it.
type CheckpointHealth struct {
	// Lag is how long the oldest entry the checkpointer has read and no
	// checkpoint covers yet has waited (0 when it has read none).
	Lag time.Duration
	// Uncovered counts the entries read and not yet covered.
	Uncovered int
	// Alarm, when not "", says what is wrong: the checkpointer refuses to
	// sign (the stream or the checkpoint kept in Redis differs from what
	// it read and signed), someone else wrote its lock, or no checkpoint
	// has covered an entry within CheckpointBound.
	Alarm string
}

// ResumeChain returns a ChainVerifier that continues a chain whose last
// entry (seq) had hash: the next entry must have seq+1 and prev hash.
func ResumeChain(seq int64, hash string) ChainVerifier {
	if seq == 0 {
		return ChainVerifier{}
	}
	return ChainVerifier{n: 1, prevSeq: seq, prevHash: hash}
}

// CheckpointProof checks a stream against verified checkpoints (see
// VerifyCheckpoints), one entry at a time in stream order, like
// ChainVerifier, and then Finish checks what is missing. Failures are
// *ChainError values naming the entry.
type CheckpointProof struct {
	cps    []Checkpoint
	chain  ChainVerifier
	at     int // index into cps: the first checkpoint whose Seq >= the last entry's
	n      int
	first  Entry
	last   Entry
	before int // entries up to the last checkpoint's Seq
}

// NewCheckpointProof checks entries against cps, which must have passed
// VerifyCheckpoints (sorted by Seq).
func NewCheckpointProof(cps []Checkpoint) *CheckpointProof {
	return &CheckpointProof{cps: cps}
}

// Next checks e: the hash chain (ChainVerifier), then that e is the entry
// the checkpoints covering its seq signed.
func (p *CheckpointProof) Next(e Entry) error {
	idx := p.n
	if err := p.chain.Next(e); err != nil {
		return err
	}
	p.n++
	if idx == 0 {
		p.first = e
	}
	p.last = e
	for p.at < len(p.cps) && p.cps[p.at].Seq < e.Seq {
		p.at++
	}
	if p.at == len(p.cps) {
		return nil // after the last checkpoint: not yet covered
	}
	p.before++
	c := p.cps[p.at]
	fail := func(why string) error { return &ChainError{Index: idx, ID: e.ID, Seq: e.Seq, Why: why} }
	signed := fmt.Sprintf("checkpoint %d (seq %d, signed %s)", p.at+1, c.Seq, c.Time.UTC().Format(time.RFC3339))
	if e.Seq >= c.From && len(c.Hashes) > 0 && ShortHash(e.Hash) != c.Hashes[e.Seq-c.From] {
		return fail("differs from the entry " + signed + " covers: rewritten after it was signed")
	}
	if e.Seq == c.Seq && e.Hash != c.Head {
		return fail(fmt.Sprintf("hash differs from the head signed by %s: an entry from seq %d to %d was rewritten", signed, c.From, c.Seq))
	}
	return nil
}

// Checked is the number of entries checked so far.
func (p *CheckpointProof) Checked() int { return p.n }

// CheckpointSummary is what Finish found.
type CheckpointSummary struct {
	Checkpoints int   // checkpoints checked
	Covered     int   // entries up to the last checkpoint's Seq, each proven
	Uncovered   int   // entries after it: not yet covered by a checkpoint
	LastSeq     int64 // the last checkpoint's Seq
}

// Finish checks, after the last entry, that nothing a checkpoint covers is
// missing: the stream must reach the last checkpoint's Seq (else its tail
// was cut), and must not start after the oldest entry the last checkpoint
// saw unless the writer's own trimming explains it (else its head was
// deleted, whatever the store says about trimming).
func (p *CheckpointProof) Finish() (CheckpointSummary, error) {
	sum := CheckpointSummary{Checkpoints: len(p.cps), Covered: p.before, Uncovered: p.n - p.before}
	if len(p.cps) == 0 {
		return sum, nil
	}
	last := p.cps[len(p.cps)-1]
	sum.LastSeq = last.Seq
	signed := fmt.Sprintf("checkpoint %d (signed %s)", len(p.cps), last.Time.UTC().Format(time.RFC3339))
	switch {
	case p.n == 0 && last.Seq > 0:
		return sum, &ChainError{Index: 0, Seq: last.Seq,
			Why: fmt.Sprintf("the stream is empty but %s covers entries up to seq %d: truncated", signed, last.Seq)}
	case p.n > 0 && p.last.Seq < last.Seq:
		return sum, &ChainError{Index: p.n - 1, ID: p.last.ID, Seq: p.last.Seq,
			Why: fmt.Sprintf("the stream ends at seq %d but %s covers entries up to seq %d: entries %d to %d were cut off the end",
				p.last.Seq, signed, last.Seq, p.last.Seq+1, last.Seq)}
	}
	if p.n > 0 && p.first.Seq > 1 && p.first.Seq > last.First {
		// The writer trims with XADD MAXLEN ~, which keeps at least MaxLen
		// entries: a shorter stream was not trimmed by the writer.
		if last.MaxLen == 0 || int64(p.n) < last.MaxLen {
			return sum, &ChainError{Index: 0, ID: p.first.ID, Seq: p.first.Seq,
				Why: fmt.Sprintf("the stream starts at seq %d but %s saw it start at seq %d: entries %d to %d it covers are gone (trimmed past a checkpoint)",
					p.first.Seq, signed, last.First, last.First, min(p.first.Seq-1, last.Seq))}
		}
	}
	return sum, nil
}

// MergeCheckpoints puts the checkpoints of several witnesses (each may
// hold only some: a replica's file, a channel) into one list: each once,
// in chain order (by Seq, then signing time).
func MergeCheckpoints(lists ...[]Checkpoint) []Checkpoint {
	seen := map[string]bool{}
	var out []Checkpoint
	for _, l := range lists {
		for _, c := range l {
			h := c.Hash()
			if seen[h] {
				continue
			}
			seen[h] = true
			out = append(out, c)
		}
	}
	slices.SortStableFunc(out, func(a, b Checkpoint) int {
		return cmp.Or(cmp.Compare(a.Seq, b.Seq), a.Time.Compare(b.Time))
	})
	return out
}
