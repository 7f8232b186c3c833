package store

// This file: the checkpointer, which signs the audit chain's head with a
// key Redis never holds and hands each checkpoint to witnesses outside
// Redis (approval/checkpoint.go has the checkpoint and its verification).

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/option"
)

// Checkpoint defaults.
const (
	// DefaultCheckpointEvery is how many new entries make a checkpoint
	// (and the most one checkpoint covers).
	DefaultCheckpointEvery = 1000
	// DefaultCheckpointInterval is how old the newest entry not yet covered
	// may get: a checkpoint follows within it.
	DefaultCheckpointInterval = time.Minute
	// checkpointPoll is how often Run looks at the chain head.
	checkpointPoll = time.Second
	// checkpointLockTTL bounds how long a replica that died mid-checkpoint
	// keeps the others from making one.
	checkpointLockTTL = 30 * time.Second
)

var (
	// ErrCheckpointBusy: another process is making a checkpoint of the
	// same stream right now.
	ErrCheckpointBusy = errors.New("store: another checkpoint of this stream is in progress")
	// ErrCheckpointDiverged: the stream no longer extends the last
	// checkpoint (history rewritten or cut in Redis), or the checkpoint
	// kept in Redis is not signed by this key. Nothing is signed until an
	// operator has looked.
	ErrCheckpointDiverged = errors.New("store: the audit stream no longer extends the last signed checkpoint")
)

// Witness keeps checkpoints outside Redis (a file, a webhook, a Slack
// channel); cmd/countersign wires them.
type Witness interface {
	// Name says which witness it is, for logs.
	Name() string
	// Publish delivers c; an error means it may not have been kept.
	Publish(ctx context.Context, c approval.Checkpoint) error
}

// CheckpointOptions configures a Checkpointer.
type CheckpointOptions struct {
	// Key signs every checkpoint; required.
	Key ed25519.PrivateKey
	// Witnesses receive every checkpoint. With none, checkpoints are kept
	// in Redis only and prove nothing (cmd says so at start).
	Witnesses []Witness
	// Every is how many new entries make a checkpoint, and the most one
	// covers; default DefaultCheckpointEvery.
	Every int64
	// Interval: new entries are covered within it; default
	// DefaultCheckpointInterval.
	Interval time.Duration
	// MaxLen is the writer's AuditOptions.MaxLen, signed into each
	// checkpoint so that verification tells its trimming from a deletion.
	MaxLen int64
	// Now stamps checkpoints; default time.Now.
	Now func() time.Time
	// Ticker drives Run (default a time.Ticker); tests tick it by hand.
	Ticker func(d time.Duration) (<-chan time.Time, func())
	// Logger; default discards.
	Logger *slog.Logger
}

// Checkpointer makes signed checkpoints of one audit stream. Any number
// of replicas may run one over the same stream: a lock in Redis lets one
// at a time sign, and the last checkpoint kept in Redis (verified with the
// key before it is built on) chains the next one, whoever makes it.
//
// A Checkpointer is safe for concurrent use.
type Checkpointer struct {
	a         *Audit
	key       ed25519.PrivateKey
	pub       ed25519.PublicKey
	witnesses []Witness
	every     int64
	interval  time.Duration
	maxLen    int64
	now       func() time.Time
	ticker    func(d time.Duration) (<-chan time.Time, func())
	log       *slog.Logger
	lastKey   string // the last checkpoint (JSON, without hashes)
	lockKey   string
}

// NewCheckpointer returns a Checkpointer of a's stream. It does not touch
// Redis.
func NewCheckpointer(a *Audit, opts CheckpointOptions) *Checkpointer {
	c := &Checkpointer{
		a:         a,
		key:       opts.Key,
		pub:       opts.Key.Public().(ed25519.PublicKey),
		witnesses: opts.Witnesses,
		every:     option.PositiveOr(opts.Every, DefaultCheckpointEvery),
		interval:  cmp.Or(opts.Interval, DefaultCheckpointInterval),
		maxLen:    opts.MaxLen,
		now:       option.FuncOr(opts.Now, time.Now),
		ticker:    opts.Ticker,
		log:       cmp.Or(opts.Logger, slog.New(slog.DiscardHandler)),
	}
	if c.ticker == nil {
		c.ticker = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}
	}
	// In the head's slot (auditHeadKey): one Cluster slot for all.
	c.lastKey = a.head + ":checkpoint"
	c.lockKey = a.head + ":checkpoint:lock"
	return c
}

// Last returns the last checkpoint kept in Redis, checked against the key
// (nil when there is none yet). A checkpoint not signed by this key — nor
// naming it as the next key, after a rotation — is ErrCheckpointDiverged.
func (c *Checkpointer) Last(ctx context.Context) (*approval.Checkpoint, error) {
	raw, err := c.a.rdb.Get(ctx, c.lastKey).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read last checkpoint: %w", err)
	}
	var cp approval.Checkpoint
	if err := json.Unmarshal([]byte(raw), &cp); err != nil {
		return nil, fmt.Errorf("%w: the checkpoint in %s is not JSON: %v", ErrCheckpointDiverged, c.lastKey, err)
	}
	switch cp.NextKey {
	case "":
	case approval.EncodePublicKey(c.pub):
		return &cp, nil // the old key's last word: this key signs from here on
	default:
		return nil, fmt.Errorf("%w: the chain was handed over to another key (a rotation): restart with the new key", ErrCheckpointDiverged)
	}
	if err := cp.CheckSignature(c.pub); err != nil {
		return nil, fmt.Errorf("%w: the checkpoint in %s: %v", ErrCheckpointDiverged, c.lastKey, err)
	}
	return &cp, nil
}

// Checkpoint signs and publishes checkpoints until the stream's current
// head is covered (each covering at most Every entries) and returns the
// last one; made is false when nothing new needed covering. Each is
// chained to the one before (kept in Redis) after the entries since it
// are checked to extend it: a stream that does not is
// ErrCheckpointDiverged and nothing is signed. ErrCheckpointBusy means
// another process holds the lock.
func (c *Checkpointer) Checkpoint(ctx context.Context) (cp *approval.Checkpoint, made bool, err error) {
	return c.checkpoint(ctx, "")
}

// Rotate publishes a checkpoint (covering any new entries) that names
// next as the key of every later checkpoint. Processes then sign with the
// key whose public half is next.
func (c *Checkpointer) Rotate(ctx context.Context, next ed25519.PublicKey) (*approval.Checkpoint, error) {
	cp, _, err := c.checkpoint(ctx, approval.EncodePublicKey(next))
	return cp, err
}

func (c *Checkpointer) checkpoint(ctx context.Context, nextKey string) (*approval.Checkpoint, bool, error) {
	token := newOp()
	ok, err := c.a.rdb.SetNX(ctx, c.lockKey, token, checkpointLockTTL).Result()
	if err != nil {
		return nil, false, fmt.Errorf("checkpoint lock: %w", err)
	}
	if !ok {
		return nil, false, ErrCheckpointBusy
	}
	defer func() {
		// Release only our own lock (it may have expired and been taken).
		_ = unlockScript.Run(context.WithoutCancel(ctx), c.a.rdb, []string{c.lockKey}, token).Err()
	}()

	last, err := c.Last(ctx)
	if err != nil {
		c.log.Error("audit checkpoint refused: the checkpoint kept in Redis is not ours", "stream", c.a.stream, "err", err)
		return nil, false, err
	}
	made := false
	for {
		cp, more, err := c.next(ctx, last, nextKey)
		if err != nil {
			return last, made, err
		}
		if cp == nil {
			return last, made, nil
		}
		last, made, nextKey = cp, true, ""
		if !more {
			return last, made, nil
		}
	}
}

// unlockScript deletes the lock if it still holds the caller's token.
//
//	KEYS[1]   lock
//	ARGV[1]   token
//
// Reply: 1 deleted, 0 not held by token.
var unlockScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// next signs one checkpoint after last covering up to Every new entries
// (nil when there are none and no rotation is asked for); more is true
// when entries remain after it.
func (c *Checkpointer) next(ctx context.Context, last *approval.Checkpoint, nextKey string) (*approval.Checkpoint, bool, error) {
	start, chain := "-", approval.ChainVerifier{}
	if last != nil && last.EntryID != "" {
		start, chain = "("+last.EntryID, approval.ResumeChain(last.Seq, last.Head)
	}
	msgs, err := c.a.rdb.XRangeN(ctx, c.a.stream, start, "+", c.every).Result()
	if err != nil {
		return nil, false, fmt.Errorf("checkpoint read entries: %w", err)
	}
	if len(msgs) == 0 && nextKey == "" {
		return nil, false, nil
	}
	cp := approval.Checkpoint{Stream: c.a.stream, MaxLen: c.maxLen, NextKey: nextKey, Time: c.now().Round(0)}
	if last != nil {
		cp.Seq, cp.EntryID, cp.Head, cp.From, cp.Prev = last.Seq, last.EntryID, last.Head, last.Seq+1, last.Hash()
	}
	for i, m := range msgs {
		e, err := parseEntry(m)
		if err == nil {
			err = chain.Next(e)
		}
		if err != nil {
			err = fmt.Errorf("%w: %v", ErrCheckpointDiverged, err)
			c.log.Error("audit checkpoint refused: the stream does not extend the last signed checkpoint: history was rewritten or cut in Redis; run `countersign audit verify --pubkey … --checkpoints …`",
				"stream", c.a.stream, "last_checkpoint_seq", cp.Seq, "err", err)
			return nil, false, err
		}
		if i == 0 && last == nil {
			cp.From = e.Seq
		}
		cp.Hashes = append(cp.Hashes, approval.ShortHash(e.Hash))
		cp.Seq, cp.EntryID, cp.Head = e.Seq, e.ID, e.Hash
	}
	if len(msgs) == 0 && last == nil {
		cp.From = 1
	}
	cp.Covered = approval.CoveredDigest(cp.Hashes)
	cp.First = cp.From
	if last != nil {
		cp.First = last.First
	}
	if oldest, err := c.a.rdb.XRangeN(ctx, c.a.stream, "-", "+", 1).Result(); err != nil {
		return nil, false, fmt.Errorf("checkpoint read oldest entry: %w", err)
	} else if len(oldest) == 1 {
		seq, perr := strconv.ParseInt(fmt.Sprint(oldest[0].Values[fieldSeq]), 10, 64)
		switch {
		case perr != nil || seq <= cp.First:
		case c.maxLen > 0:
			cp.First = seq // the writer's own trimming
		default:
			err := fmt.Errorf("%w: the stream starts at seq %d but the last checkpoint saw it start at seq %d, and this writer never trims: entries were deleted",
				ErrCheckpointDiverged, seq, cp.First)
			c.log.Error("audit checkpoint refused", "stream", c.a.stream, "err", err)
			return nil, false, err
		}
	}
	signed := approval.SignCheckpoint(c.key, cp)
	if err := c.publish(ctx, signed); err != nil {
		return nil, false, err
	}
	kept := signed
	kept.Hashes = nil
	b, err := json.Marshal(kept)
	if err != nil {
		return nil, false, fmt.Errorf("checkpoint encode: %w", err)
	}
	if err := c.a.rdb.Set(ctx, c.lastKey, b, 0).Err(); err != nil {
		return nil, false, fmt.Errorf("checkpoint keep: %w", err)
	}
	c.log.Info("audit checkpoint", "stream", c.a.stream, "seq", signed.Seq, "from", signed.From, "key_id", signed.KeyID)
	return &signed, int64(len(msgs)) == c.every, nil
}

// publish hands cp to every witness; it fails only when witnesses are
// configured and none kept it (the next checkpoint would name one nobody
// has).
func (c *Checkpointer) publish(ctx context.Context, cp approval.Checkpoint) error {
	var errs []error
	for _, w := range c.witnesses {
		if err := w.Publish(ctx, cp); err != nil {
			c.log.Error("audit checkpoint not delivered to a witness", "witness", w.Name(), "seq", cp.Seq, "err", err)
			errs = append(errs, fmt.Errorf("%s: %w", w.Name(), err))
		}
	}
	if len(c.witnesses) > 0 && len(errs) == len(c.witnesses) {
		return fmt.Errorf("checkpoint seq %d: no witness kept it: %w", cp.Seq, errors.Join(errs...))
	}
	return nil
}

// Due reports whether a checkpoint is due: Every entries are not yet
// covered, or some are and the last checkpoint is Interval old.
func (c *Checkpointer) Due(ctx context.Context) (bool, error) {
	head, _, known, err := c.a.readHead(ctx)
	if err != nil || !known {
		return false, err
	}
	last, err := c.Last(ctx)
	if err != nil {
		return false, err
	}
	if last == nil {
		return head.seq > 0, nil
	}
	return head.seq-last.Seq >= c.every || (head.seq > last.Seq && c.now().Sub(last.Time) >= c.interval), nil
}

// Run makes a checkpoint whenever one is due (Due, looked at every
// second) until ctx ends. Errors are logged; a diverged stream is logged
// at each look until an operator acts. It returns when ctx is done.
func (c *Checkpointer) Run(ctx context.Context) {
	tick, stop := c.ticker(checkpointPoll)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		due, err := c.Due(ctx)
		if err != nil {
			if ctx.Err() == nil {
				c.log.Error("audit checkpoint", "stream", c.a.stream, "err", err)
			}
			continue
		}
		if !due {
			continue
		}
		if _, _, err := c.Checkpoint(ctx); err != nil && !errors.Is(err, ErrCheckpointBusy) && ctx.Err() == nil {
			c.log.Error("audit checkpoint", "stream", c.a.stream, "err", err)
		}
	}
}
