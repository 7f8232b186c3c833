package store

// This file: the checkpointer, which follows the audit stream as it grows,
// signs what it read with a key Redis never holds and hands each
// checkpoint to witnesses outside Redis (approval/checkpoint.go has the
// checkpoint and its verification).
//
// It trusts only what it read and what it signed. It keeps its own running
// head in memory (each entry's hash recomputed, each linked to the one
// before), never a head Redis tells it; before it signs, it reads again
// what it read and refuses, with an alarm, when Redis's history differs.
// The checkpoint it builds on is the last one it signed, or one read from
// Redis or its witness whose signature it checked. Its lock in Redis is
// signed and expires: one no replica wrote is taken over, with an alarm.
// Whatever stops checkpoints, an entry left uncovered past the bound
// (approval.CheckpointBound) is an alarm (Health, the log, Alarms), not a
// silence.

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
	"github.com/countersign/countersign/approval/clock"
	"github.com/countersign/countersign/approval/option"
)

// Checkpoint defaults.
const (
	// DefaultCheckpointEvery is how many new entries make a checkpoint
	// (and the most one checkpoint covers).
	DefaultCheckpointEvery = 1000
	// DefaultCheckpointInterval is how old the last checkpoint may get
	// while entries wait: a checkpoint follows within it.
	DefaultCheckpointInterval = time.Minute
	// checkpointPoll is how often Run looks (Tick), and how long the
	// follower waits after a read that failed.
	checkpointPoll = time.Second
	// checkpointFollowBlock is how long one XREAD of the follower blocks
	// before it checks ctx again (Run returns within it). An entry is read
	// as soon as it is appended, unless the follower is waiting after a
	// failure.
	checkpointFollowBlock = 500 * time.Millisecond
	// checkpointPage is how many entries one read or check takes.
	checkpointPage = 1000
	// checkpointSeenMax (times Every) is how many entries read and not yet
	// covered the follower keeps; a full follower stops reading until a
	// checkpoint covers some (the lag alarm is up long before).
	checkpointSeenMax = 100
	// checkpointLockTTL bounds how long a replica that died mid-checkpoint
	// keeps the others from making one.
	checkpointLockTTL = 30 * time.Second
	// checkpointLockSkew is how far past its signed expiry a lock still
	// counts as a replica's (clocks differ a little).
	checkpointLockSkew = 5 * time.Second
	// checkpointAlarmRepeat: an alarm that lasts is logged again this often.
	checkpointAlarmRepeat = time.Minute
	// checkpointAlarmSend bounds telling Alarms of an alarm.
	checkpointAlarmSend = 10 * time.Second
)

var (
	// ErrCheckpointBusy: another replica is making a checkpoint of the
	// same stream right now.
	ErrCheckpointBusy = errors.New("store: another checkpoint of this stream is in progress")
	// ErrCheckpointDiverged: the stream no longer extends the last
	// checkpoint, or differs from what the checkpointer read (history
	// rewritten or cut in Redis), or the checkpoint to build on is not
	// signed by this key. Nothing is signed until an operator has looked.
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

// WitnessLog reads back what a witness kept (the file witness): the
// checkpointer starts from its last checkpoint, not from Redis's copy
// alone.
type WitnessLog interface {
	// Last returns the newest checkpoint kept, nil when there is none; an
	// error means it could not be read.
	Last(ctx context.Context) (*approval.Checkpoint, error)
}

// Alarms tells people, outside Redis, that checkpoints are in trouble (an
// ops Slack channel); cmd/countersign wires it.
type Alarms interface {
	// Alarm says what is wrong with the checkpoints of stream. An error
	// means the message may not have been delivered (it is logged).
	Alarm(ctx context.Context, stream, reason string) error
	// Cleared says the alarm (reason) no longer holds.
	Cleared(ctx context.Context, stream, reason string) error
}

// CheckpointOptions configures a Checkpointer.
type CheckpointOptions struct {
	// Key signs every checkpoint; required.
	Key ed25519.PrivateKey
	// PreviousKey is the key Key replaced (a rotation): the checkpoint it
	// signed naming Key as the next key is built on. Without it (or a
	// Record holding that checkpoint) the new key refuses to continue.
	PreviousKey ed25519.PublicKey
	// Witnesses receive every checkpoint. With none, checkpoints are kept
	// in Redis only and prove nothing (cmd says so at start).
	Witnesses []Witness
	// Record, when set, is a witness read back at start (the file
	// witness): its last checkpoint is trusted over Redis's copy.
	Record WitnessLog
	// Alarms, when set, is told of every alarm and of its end.
	Alarms Alarms
	// Every is how many new entries make a checkpoint, and the most one
	// covers; default DefaultCheckpointEvery.
	Every int64
	// Interval: new entries are covered within it; default
	// DefaultCheckpointInterval. An entry waits longer than
	// approval.CheckpointBound(Interval) only with an alarm.
	Interval time.Duration
	// MaxLen is the writer's AuditOptions.MaxLen, signed into each
	// checkpoint so that verification tells its trimming from a deletion.
	MaxLen int64
	// Now stamps checkpoints and times the alarms; default time.Now.
	Now func() time.Time
	// Ticker drives Run (default a time.Ticker); tests tick it by hand.
	Ticker func(d time.Duration) (<-chan time.Time, func())
	// Logger; default discards.
	Logger *slog.Logger
}

// Checkpointer makes signed checkpoints of one audit stream. Any number
// of replicas may run one over the same stream: each follows the stream,
// a lock in Redis lets one at a time sign, and the others take over the
// checkpoint it kept in Redis once they have checked its signature and
// that it signed what they read.
//
// A Checkpointer is safe for concurrent use.
type Checkpointer struct {
	a         *Audit
	key       ed25519.PrivateKey
	pub       ed25519.PublicKey
	ours      string // pub, encoded as NextKey names it
	prevKey   ed25519.PublicKey
	witnesses []Witness
	record    WitnessLog
	alarms    Alarms
	every     int64
	interval  time.Duration
	bound     time.Duration
	maxLen    int64
	now       func() time.Time
	ticker    func(d time.Duration) (<-chan time.Time, func())
	log       *slog.Logger
	lastKey   string // the last checkpoint (JSON, without hashes)
	lockKey   string

	// signing lets one checkpoint at a time be made in this process (a
	// one-slot semaphore, so waiting honours ctx).
	signing chan struct{}
	// starting serialises start's reads of Redis and the witness.
	starting sync.Mutex
	// afterRead, set by tests only, is called after entries are read,
	// with the seq of the last one.
	afterRead func(seq int64)

	mu sync.Mutex // guards the fields below
	// started is true once last is settled (start).
	started bool
	// last is the checkpoint built on: signed here, or read and verified;
	// nil before the stream's first.
	last *approval.Checkpoint
	// seen are the entries read after last, in stream order; base is the
	// hash the first of them chains to.
	seen []seenEntry
	base string
	// readID, headSeq and headHash are the last entry read ("0-0", 0, ""
	// before any): the running head, recomputed here, never Redis's.
	readID   string
	headSeq  int64
	headHash string
	// problems are what is wrong now, by kind (alarmHistory…).
	problems map[string]problem
	// failing is when reading Redis started failing (zero: it works);
	// failErr is the last failure.
	failing time.Time
	failErr string
	// stalled says why the last checkpoint due was not made ("" when it was).
	stalled string
	// raised is the alarm last told (its kinds, its text), logged at.
	raisedKinds, raisedWhy string
	loggedAt               time.Time
}

// seenEntry is an entry as the checkpointer read it.
type seenEntry struct {
	id   string
	seq  int64
	hash string
	at   time.Time // when it was read
}

// problem is one thing wrong; until, when set, ends it (an event, such as
// a forgery this process has since replaced, shown for the bound);
// otherwise it lasts until cleared.
type problem struct {
	why   string
	until time.Time
}

// Kinds of problem, in the order the alarm names them.
const (
	alarmHistory = "history" // Redis's history differs from what was read
	alarmStored  = "stored"  // the checkpoint to build on was refused
	alarmLock    = "lock"    // a lock no replica wrote was taken over
)

var alarmKinds = []string{alarmHistory, alarmStored, alarmLock}

// NewCheckpointer returns a Checkpointer of a's stream. It does not touch
// Redis.
func NewCheckpointer(a *Audit, opts CheckpointOptions) *Checkpointer {
	pub := opts.Key.Public().(ed25519.PublicKey)
	c := &Checkpointer{
		a:         a,
		key:       opts.Key,
		pub:       pub,
		ours:      approval.EncodePublicKey(pub),
		prevKey:   opts.PreviousKey,
		witnesses: opts.Witnesses,
		record:    opts.Record,
		alarms:    opts.Alarms,
		every:     option.PositiveOr(opts.Every, DefaultCheckpointEvery),
		interval:  cmp.Or(opts.Interval, DefaultCheckpointInterval),
		maxLen:    opts.MaxLen,
		now:       option.FuncOr(opts.Now, time.Now),
		ticker:    opts.Ticker,
		log:       cmp.Or(opts.Logger, slog.New(slog.DiscardHandler)),
		signing:   make(chan struct{}, 1),
		readID:    "0-0",
		problems:  map[string]problem{},
	}
	c.bound = approval.CheckpointBound(c.interval)
	if c.ticker == nil {
		c.ticker = clock.NewTicker
	}
	// In the head's slot (auditHeadKey): one Cluster slot for all.
	c.lastKey = a.head + ":checkpoint"
	c.lockKey = a.head + ":checkpoint:lock"
	return c
}

// ForgetCheckpoints deletes the checkpoint a's stream keeps in Redis, and
// its lock: the next checkpointer starts a new chain. Only for a world
// whose key and witnesses are new each run (the demo); anywhere else, a
// chain cut this way shows as a break to `audit verify --checkpoints`.
func ForgetCheckpoints(ctx context.Context, a *Audit) error {
	if err := a.rdb.Del(ctx, a.head+":checkpoint", a.head+":checkpoint:lock").Err(); err != nil {
		return fmt.Errorf("forget checkpoints of %s: %w", a.stream, err)
	}
	return nil
}

// Health says how checkpoints are doing: what this process has read and
// not yet seen covered, and the alarm, if any.
func (c *Checkpointer) Health() approval.CheckpointHealth {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, _ := c.healthLocked(c.now())
	return h
}

// healthLocked is Health and the kinds of problem its alarm names ("lag"
// for the bound). The caller holds mu.
func (c *Checkpointer) healthLocked(now time.Time) (approval.CheckpointHealth, string) {
	h := approval.CheckpointHealth{Uncovered: len(c.seen)}
	if len(c.seen) > 0 {
		h.Lag = max(now.Sub(c.seen[0].at), 0)
	}
	var why, kinds []string
	add := func(kind, text string) {
		why, kinds = append(why, text), append(kinds, kind)
	}
	for _, k := range alarmKinds {
		if p, ok := c.problems[k]; ok && (p.until.IsZero() || now.Before(p.until)) {
			add(k, p.why)
		}
	}
	if c.last != nil && c.last.NextKey != "" && c.last.NextKey != c.ours {
		add("key", fmt.Sprintf("the chain was handed over to key %s (a rotation): this process signs with key %s and signs no more; restart it with the new key",
			keyIDOf(c.last.NextKey), approval.KeyID(c.pub)))
	}
	if !c.failing.IsZero() && now.Sub(c.failing) > c.bound {
		add("redis", fmt.Sprintf("cannot read the audit stream or its checkpoint for %s: %s", now.Sub(c.failing).Round(time.Second), c.failErr))
	}
	if h.Lag > c.bound {
		text := fmt.Sprintf("no checkpoint covers the %d entries read since %s (%s ago; the bound is %s)",
			len(c.seen), c.seen[0].at.UTC().Format(time.RFC3339), h.Lag.Round(time.Second), c.bound)
		if c.stalled != "" {
			text += ": " + c.stalled
		}
		add("lag", text)
	}
	h.Alarm = strings.Join(why, "; ")
	return h, strings.Join(kinds, ",")
}

// keyIDOf names an encoded public key by its KeyID.
func keyIDOf(encoded string) string {
	pub, err := approval.ParsePublicKey(encoded)
	if err != nil {
		return strconv.Quote(clip.Bytes(encoded, 60))
	}
	return approval.KeyID(pub)
}

// setProblem records what is wrong (for d when d > 0, else until
// cleared). The caller holds mu.
func (c *Checkpointer) setProblem(kind, why string, d time.Duration) {
	p := problem{why: why}
	if d > 0 {
		p.until = c.now().Add(d)
	}
	c.problems[kind] = p
}

// clearProblem forgets a problem that no longer holds (not one shown for
// a while). The caller holds mu.
func (c *Checkpointer) clearProblem(kind string) {
	if p, ok := c.problems[kind]; ok && p.until.IsZero() {
		delete(c.problems, kind)
	}
}

// redisFailed and redisWorks time how long reading Redis has failed.
func (c *Checkpointer) redisFailed(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failing.IsZero() {
		c.failing = c.now()
	}
	c.failErr = err.Error()
}

func (c *Checkpointer) redisWorks() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failing, c.failErr = time.Time{}, ""
}

// diverged records that Redis's history differs from what was read and
// returns the error.
func (c *Checkpointer) diverged(format string, args ...any) error {
	why := fmt.Sprintf(format, args...)
	c.mu.Lock()
	c.setProblem(alarmHistory, "refusing to sign: "+why+": history was rewritten or cut in Redis; run `countersign audit verify --pubkey … --checkpoints …`", 0)
	c.mu.Unlock()
	return fmt.Errorf("%w: %s", ErrCheckpointDiverged, why)
}

// refused records that the checkpoint to build on was refused and
// returns the error.
func (c *Checkpointer) refused(format string, args ...any) error {
	why := fmt.Sprintf(format, args...)
	c.mu.Lock()
	c.setProblem(alarmStored, why, 0)
	c.mu.Unlock()
	return fmt.Errorf("%w: %s", ErrCheckpointDiverged, why)
}

// Checkpoint reads what is new in the stream, checks that Redis still
// holds what was read, and signs and publishes checkpoints until every
// entry read is covered (each covering at most Every entries); it returns
// the last one, and made is false when nothing new needed covering. A
// stream that differs from what was read, or a checkpoint to build on not
// signed by this key, is ErrCheckpointDiverged and nothing is signed.
// ErrCheckpointBusy means another replica holds the lock.
func (c *Checkpointer) Checkpoint(ctx context.Context) (cp *approval.Checkpoint, made bool, err error) {
	return c.checkpoint(ctx, "")
}

// Rotate publishes a checkpoint (covering any new entries) that names
// next as the key of every later checkpoint. Processes then sign with the
// key whose public half is next; this one signs no more.
func (c *Checkpointer) Rotate(ctx context.Context, next ed25519.PublicKey) (*approval.Checkpoint, error) {
	cp, _, err := c.checkpoint(ctx, approval.EncodePublicKey(next))
	return cp, err
}

// Run follows the stream and makes a checkpoint whenever one is due
// (Tick, every second) until ctx ends; it returns when ctx is done and
// its follower has stopped.
func (c *Checkpointer) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { c.follow(ctx) }) // exits when ctx ends
	tick, stop := c.ticker(checkpointPoll)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		// A refusal is in the alarm, which Tick logs.
		if err := c.Tick(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, ErrCheckpointDiverged) {
			c.log.Warn("audit checkpoint", "stream", c.a.stream, "err", err)
		}
	}
}

// follow reads the stream as it grows, one XREAD at a time blocking at
// most checkpointFollowBlock, until ctx ends. After a failure (Redis, a
// history that does not link, a full follower) it waits checkpointPoll.
func (c *Checkpointer) follow(ctx context.Context) {
	for ctx.Err() == nil {
		err := c.start(ctx)
		full := false
		if err == nil {
			full, err = c.read(ctx, checkpointFollowBlock)
		}
		if err != nil || full {
			if clock.Sleep(ctx, checkpointPoll) != nil {
				return
			}
		}
	}
}

// Tick is one look, as Run makes every second: it reads what is new in
// the stream, takes over a checkpoint another replica signed, makes a
// checkpoint when one is due (Every entries read and not covered, or some
// and the last checkpoint is Interval old), and raises or clears the
// alarm (logged, told to Alarms, in Health). The error is what failed in
// this look; another replica holding the lock is not one.
func (c *Checkpointer) Tick(ctx context.Context) error {
	err := c.tick(ctx)
	c.mu.Lock()
	switch {
	case err == nil:
		c.stalled = ""
	case errors.Is(err, ErrCheckpointBusy):
		c.stalled = "the checkpoint lock is held by another replica"
		err = nil
	default:
		c.stalled = err.Error()
	}
	c.mu.Unlock()
	c.tell(ctx)
	return err
}

func (c *Checkpointer) tick(ctx context.Context) error {
	if err := c.start(ctx); err != nil {
		return err
	}
	if err := c.catchUp(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	waiting := len(c.seen)
	c.mu.Unlock()
	if waiting > 0 {
		if err := c.adopt(ctx); err != nil {
			return err
		}
	}
	if !c.due() {
		return nil
	}
	_, _, err := c.checkpoint(ctx, "")
	return err
}

// due reports whether a checkpoint is due.
func (c *Checkpointer) due() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := int64(len(c.seen))
	switch {
	case n == 0:
		return false
	case c.last == nil || n >= c.every:
		return true
	}
	return c.now().Sub(c.last.Time) >= c.interval
}

// tell raises the alarm when something is newly wrong (an ERROR line,
// Alarms), logs it again every checkpointAlarmRepeat while it lasts, and
// says when it has ended.
func (c *Checkpointer) tell(ctx context.Context) {
	c.mu.Lock()
	now := c.now()
	h, kinds := c.healthLocked(now)
	was, wasWhy := c.raisedKinds, c.raisedWhy
	raise := kinds != "" && kinds != was
	cleared := kinds == "" && was != ""
	repeat := !raise && kinds != "" && now.Sub(c.loggedAt) >= checkpointAlarmRepeat
	if raise || repeat {
		c.loggedAt = now
	}
	if raise || cleared {
		c.raisedKinds, c.raisedWhy = kinds, h.Alarm
	}
	c.mu.Unlock()
	switch {
	case raise || repeat:
		c.log.Error("audit checkpoint ALARM", "stream", c.a.stream, "alarm", h.Alarm, "uncovered", h.Uncovered, "lag", h.Lag.Round(time.Second).String())
	case cleared:
		c.log.Info("audit checkpoint alarm cleared", "stream", c.a.stream, "was", wasWhy)
	}
	if c.alarms == nil || !(raise || cleared) {
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkpointAlarmSend)
	defer cancel()
	var err error
	if raise {
		err = c.alarms.Alarm(actx, c.a.stream, h.Alarm)
	} else {
		err = c.alarms.Cleared(actx, c.a.stream, wasWhy)
	}
	if err != nil {
		c.log.Error("audit checkpoint alarm not delivered", "stream", c.a.stream, "err", err)
	}
}

// start settles the checkpoint to build on, once: the newest of the one
// kept in Redis and the witness's last (Record), each trusted only when
// its signature checks (this key; or, for the hand-over of a rotation,
// PreviousKey or the witness's own copy).
func (c *Checkpointer) start(ctx context.Context) error {
	c.starting.Lock()
	defer c.starting.Unlock()
	c.mu.Lock()
	started := c.started
	c.mu.Unlock()
	if started {
		return nil
	}
	stored, present, err := c.stored(ctx)
	if err != nil {
		c.redisFailed(err)
		return err
	}
	var kept *approval.Checkpoint
	if c.record != nil {
		if kept, err = c.record.Last(ctx); err != nil {
			return c.refused("cannot read the witness's last checkpoint: %v", err)
		}
	}
	var storedErr, keptErr error
	switch {
	case !present:
	case stored == nil:
		storedErr = fmt.Errorf("the checkpoint kept in Redis (%s) is refused: it is not a checkpoint", c.lastKey)
	default:
		if err := c.trustStored(*stored, kept); err != nil {
			storedErr = fmt.Errorf("the checkpoint kept in Redis (%s, seq %d) is refused: %w", c.lastKey, stored.Seq, err)
			stored = nil
		}
	}
	if kept != nil {
		if err := c.trustKept(*kept); err != nil {
			keptErr = fmt.Errorf("the witness's last checkpoint (seq %d) is refused: %w", kept.Seq, err)
			kept = nil
		}
	}
	var from *approval.Checkpoint
	var note string
	switch {
	case stored != nil && kept != nil && kept.Seq > stored.Seq:
		from = kept
		note = fmt.Sprintf("the checkpoint kept in Redis (seq %d) is older than the witness's last (seq %d): rolled back in Redis, or never written there; building on the witness's", stored.Seq, kept.Seq)
	case stored != nil:
		from = stored
	case kept != nil:
		from = kept
		switch {
		case storedErr != nil:
			note = storedErr.Error() + fmt.Sprintf("; building on the witness's last (seq %d)", kept.Seq)
		case !present:
			note = fmt.Sprintf("no checkpoint is kept in Redis (%s) but the witness holds seq %d: deleted in Redis; building on the witness's", c.lastKey, kept.Seq)
		}
	case storedErr != nil:
		return c.refused("%v; nothing is signed until an operator has looked (docs/operations.md \"Checkpoint alarms\")", storedErr)
	case keptErr != nil:
		return c.refused("%v", keptErr)
	}
	if keptErr != nil && from != nil {
		c.log.Warn("audit checkpoint: the witness's last checkpoint is not this key's; building on the one kept in Redis", "stream", c.a.stream, "err", keptErr)
	}
	c.redisWorks()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.started, c.last = true, from
	if from != nil {
		c.base, c.headSeq, c.headHash = from.Head, from.Seq, from.Head
		c.readID = cmp.Or(from.EntryID, "0-0")
	}
	c.clearProblem(alarmStored)
	if note != "" {
		c.setProblem(alarmStored, note, c.bound)
	}
	return nil
}

// trustStored says why s, read from Redis, may not be built on (nil when
// it may): it must be signed by this key, or hand the chain to this key
// with a signature PreviousKey checks, or be the witness's own copy.
// Whatever its next_key says, a signature nobody checked is refused.
func (c *Checkpointer) trustStored(s approval.Checkpoint, kept *approval.Checkpoint) error {
	if s.Stream != c.a.stream {
		return fmt.Errorf("it is about stream %q, not %q", clip.Bytes(s.Stream, 200), c.a.stream)
	}
	err := s.CheckSignature(c.pub)
	if err == nil {
		return nil
	}
	if s.NextKey != c.ours {
		return err
	}
	if c.prevKey != nil {
		if perr := s.CheckSignature(c.prevKey); perr != nil {
			return fmt.Errorf("it hands the chain to this key, but its signature does not check with the previous key: %w", perr)
		}
		return nil
	}
	if kept != nil && kept.Hash() == s.Hash() {
		return nil // the witness, outside Redis, kept the very same
	}
	if s.Sig == "" {
		return errors.New("it names this key as the next one but is unsigned: this process cannot check it")
	}
	return fmt.Errorf("it hands the chain to this key but is signed by key %s, which this process cannot check: set COUNTERSIGN_AUDIT_PREVIOUS_PUBLIC_KEY to that key's public key (docs/deploy.md \"Audit signing key\")", clip.Bytes(s.KeyID, 32))
}

// trustKept says why k, the witness's last checkpoint, may not be built
// on: it must be this key's, or the old key's hand-over to this one (the
// witness is outside Redis; PreviousKey, when set, must check it).
func (c *Checkpointer) trustKept(k approval.Checkpoint) error {
	if k.Stream != c.a.stream {
		return fmt.Errorf("it is about stream %q, not %q", clip.Bytes(k.Stream, 200), c.a.stream)
	}
	err := k.CheckSignature(c.pub)
	if err == nil || k.NextKey != c.ours {
		return err
	}
	if c.prevKey != nil {
		return k.CheckSignature(c.prevKey)
	}
	return nil
}

// stored reads the checkpoint kept in Redis: present is false when there
// is none, cp nil when what is there is not a checkpoint.
func (c *Checkpointer) stored(ctx context.Context) (cp *approval.Checkpoint, present bool, err error) {
	raw, err := c.a.rdb.Get(ctx, c.lastKey).Result()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read last checkpoint: %w", err)
	}
	var s approval.Checkpoint
	if json.Unmarshal([]byte(raw), &s) != nil {
		return nil, true, nil
	}
	return &s, true, nil
}

// catchUp reads every entry appended since the last one read (up to
// what the follower keeps).
func (c *Checkpointer) catchUp(ctx context.Context) error {
	for {
		c.mu.Lock()
		from := c.readID
		c.mu.Unlock()
		full, err := c.read(ctx, 0)
		if err != nil || full {
			return err
		}
		c.mu.Lock()
		moved := c.readID != from
		c.mu.Unlock()
		if !moved {
			return nil
		}
	}
}

// read reads the entries after the last one read and takes them in, each
// checked to extend the running head. With block > 0 it waits up to block
// for the first (XREAD BLOCK: the follower); otherwise it reads what is
// there. full is true when the follower keeps all it may.
func (c *Checkpointer) read(ctx context.Context, block time.Duration) (full bool, err error) {
	c.mu.Lock()
	from, room := c.readID, int64(checkpointSeenMax)*c.every-int64(len(c.seen))
	c.mu.Unlock()
	if room <= 0 {
		return true, nil
	}
	count := min(room, checkpointPage)
	var msgs []redis.XMessage
	if block > 0 {
		streams, err := c.a.rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{c.a.stream, from}, Count: count, Block: block}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			if ctx.Err() == nil {
				c.redisFailed(err)
			}
			return false, fmt.Errorf("checkpoint follow after %s: %w", from, err)
		}
		for _, s := range streams {
			msgs = append(msgs, s.Messages...)
		}
	} else {
		start := "(" + from
		if from == "0-0" {
			start = "-"
		}
		if msgs, err = c.a.rdb.XRangeN(ctx, c.a.stream, start, "+", count).Result(); err != nil {
			c.redisFailed(err)
			return false, fmt.Errorf("checkpoint read after %s: %w", from, err)
		}
	}
	c.redisWorks()
	if err := c.take(from, msgs); err != nil {
		return false, err
	}
	if c.afterRead != nil && len(msgs) > 0 {
		c.mu.Lock()
		head := c.headSeq
		c.mu.Unlock()
		c.afterRead(head)
	}
	return false, nil
}

// take adds msgs, read after the entry from, to what was read: each must
// recompute to its hash and link to the head read before it.
func (c *Checkpointer) take(from string, msgs []redis.XMessage) error {
	c.mu.Lock()
	if c.readID != from {
		c.mu.Unlock()
		return nil // another read took them in first
	}
	now := c.now()
	var bad string
	for _, m := range msgs {
		e, err := parseEntry(m)
		if err == nil {
			err = c.extends(e)
		}
		if err != nil {
			bad = fmt.Sprintf("entry %s read at %s after seq %d: %v", m.ID, now.UTC().Format(time.RFC3339), c.headSeq, err)
			break
		}
		if len(c.seen) == 0 && c.last == nil {
			c.base = e.PrevHash
		}
		c.seen = append(c.seen, seenEntry{id: e.ID, seq: e.Seq, hash: e.Hash, at: now})
		c.readID, c.headSeq, c.headHash = e.ID, e.Seq, e.Hash
	}
	c.mu.Unlock()
	if bad != "" {
		return c.diverged("%s", bad)
	}
	return nil
}

// extends checks that e follows the head read so far: the next seq, the
// head's hash as its previous, its own hash recomputed. The first entry
// of a chain with no checkpoint yet may start part-way (a trimmed
// stream), as approval.ChainVerifier allows. The caller holds mu.
func (c *Checkpointer) extends(e approval.Entry) error {
	if c.last == nil && len(c.seen) == 0 {
		var v approval.ChainVerifier
		return v.Next(e)
	}
	switch {
	case e.Seq != c.headSeq+1:
		return fmt.Errorf("it has seq %d (entry missing, inserted or reordered)", e.Seq)
	case e.PrevHash != c.headHash:
		return fmt.Errorf("seq %d does not link to the hash read at seq %d (%s)", e.Seq, c.headSeq, approval.ShortHash(c.headHash))
	case approval.ChainHash(e.PrevHash, e) != e.Hash:
		return fmt.Errorf("seq %d: its hash does not match its content", e.Seq)
	}
	return nil
}

// check reads again, from Redis, every entry read and not yet covered,
// and the one after them: each must be exactly what was read (same id,
// seq and hash, the hash recomputing from the content, linked), and the
// next must extend them. Anything else is ErrCheckpointDiverged.
func (c *Checkpointer) check(ctx context.Context) error {
	c.mu.Lock()
	seen, prev := slices.Clone(c.seen), c.base
	headSeq, headHash := c.headSeq, c.headHash
	c.mu.Unlock()
	if len(seen) == 0 {
		return nil
	}
	start, i := seen[0].id, 0
	for i <= len(seen) {
		msgs, err := c.a.rdb.XRangeN(ctx, c.a.stream, start, "+", int64(min(len(seen)-i+1, checkpointPage))).Result()
		if err != nil {
			c.redisFailed(err)
			return fmt.Errorf("checkpoint check: %w", err)
		}
		if len(msgs) == 0 {
			break
		}
		for _, m := range msgs {
			e, perr := parseEntry(m)
			if i == len(seen) { // the entry after those read: it must extend them
				switch {
				case perr != nil:
					return c.diverged("the entry after seq %d: %v", headSeq, perr)
				case e.Seq != headSeq+1 || e.PrevHash != headHash:
					return c.diverged("the entry after seq %d (id %s, seq %d) does not link to the hash read there", headSeq, m.ID, e.Seq)
				case approval.ChainHash(e.PrevHash, e) != e.Hash:
					return c.diverged("seq %d (id %s): its hash does not match its content", e.Seq, m.ID)
				}
				i++
				break
			}
			want := seen[i]
			read := want.at.UTC().Format(time.RFC3339)
			switch {
			case m.ID != want.id:
				return c.diverged("entry %s (seq %d), read at %s, is gone from the stream (%s is in its place)", want.id, want.seq, read, m.ID)
			case perr != nil:
				return c.diverged("entry %s (seq %d), read at %s, is no longer an entry: %v", want.id, want.seq, read, perr)
			case e.Seq != want.seq || e.Hash != want.hash:
				return c.diverged("entry %s (seq %d) changed since it was read at %s: its hash was %s, now %s", want.id, want.seq, read, approval.ShortHash(want.hash), approval.ShortHash(e.Hash))
			case e.PrevHash != prev:
				return c.diverged("entry %s (seq %d) no longer links to the entry before it", want.id, want.seq)
			case approval.ChainHash(e.PrevHash, e) != e.Hash:
				return c.diverged("entry %s (seq %d) changed since it was read at %s: its hash does not match its content", want.id, want.seq, read)
			}
			prev = e.Hash
			i++
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
	if i < len(seen) {
		w := seen[i]
		return c.diverged("entries from seq %d (id %s, read at %s) on are gone from the stream", w.seq, w.id, w.at.UTC().Format(time.RFC3339))
	}
	c.redisWorks()
	c.mu.Lock()
	c.clearProblem(alarmHistory)
	c.mu.Unlock()
	return nil
}

// adopt takes over the checkpoint kept in Redis when another replica
// signed it after this one's last: signed by this key, following the
// last, and about the very entries this one read (else an alarm: one of
// them read a rewritten history). Anything else kept there is refused
// with an alarm, and this process goes on from its own last (its next
// checkpoint replaces the one in Redis).
func (c *Checkpointer) adopt(ctx context.Context) error {
	s, present, err := c.stored(ctx)
	if err != nil {
		c.redisFailed(err)
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	last := c.last
	lastSeq := int64(0)
	if last != nil {
		lastSeq = last.Seq
	}
	switch {
	case !present && last == nil:
		return nil
	case !present:
		c.setProblem(alarmStored, fmt.Sprintf("the checkpoint kept in Redis (%s) was deleted; this process goes on from seq %d", c.lastKey, lastSeq), c.bound)
		return nil
	case s == nil:
		c.setProblem(alarmStored, fmt.Sprintf("the checkpoint kept in Redis (%s) was replaced by something that is not a checkpoint; this process goes on from seq %d", c.lastKey, lastSeq), c.bound)
		return nil
	case last != nil && s.Hash() == last.Hash():
		c.clearProblem(alarmStored)
		return nil
	}
	err = s.CheckSignature(c.pub)
	if err == nil && s.Stream != c.a.stream {
		err = fmt.Errorf("it is about stream %q", clip.Bytes(s.Stream, 200))
	}
	if err != nil {
		c.setProblem(alarmStored, fmt.Sprintf("refused the checkpoint kept in Redis (%s, seq %d): %v; this process goes on from seq %d", c.lastKey, s.Seq, err, lastSeq), c.bound)
		return nil
	}
	follows := last == nil || s.Prev == last.Hash() || s.Seq > last.Seq
	if !follows {
		c.setProblem(alarmStored, fmt.Sprintf("the checkpoint kept in Redis (seq %d) is older than the last one signed (seq %d): rolled back in Redis; this process goes on from seq %d", s.Seq, lastSeq, lastSeq), c.bound)
		return nil
	}
	if s.Seq > c.headSeq {
		return nil // signed past what this one has read: taken over once read
	}
	head, id := c.base, ""
	if last != nil {
		id = last.EntryID
	}
	n := 0
	if len(c.seen) > 0 && s.Seq >= c.seen[0].seq {
		n = int(s.Seq-c.seen[0].seq) + 1
		head, id = c.seen[n-1].hash, c.seen[n-1].id
	} else if s.Seq != lastSeq {
		return nil // before what this one read: not its business
	}
	if s.Head != head || s.EntryID != id {
		why := fmt.Sprintf("refusing to sign: a checkpoint in Redis signed by this key covers seq %d with head %s, but this process read %s there: one of the replicas read a rewritten history; run `countersign audit verify --pubkey … --checkpoints …`",
			s.Seq, approval.ShortHash(s.Head), approval.ShortHash(head))
		c.setProblem(alarmHistory, why, 0)
		return fmt.Errorf("%w: %s", ErrCheckpointDiverged, why)
	}
	c.seen = slices.Delete(c.seen, 0, n)
	c.base, c.last = s.Head, s
	c.clearProblem(alarmStored)
	return nil
}

// checkpoint signs and publishes checkpoints of every entry read, the
// last naming nextKey when it is not "".
func (c *Checkpointer) checkpoint(ctx context.Context, nextKey string) (*approval.Checkpoint, bool, error) {
	select {
	case c.signing <- struct{}{}:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	defer func() { <-c.signing }()
	if err := c.start(ctx); err != nil {
		return nil, false, err
	}
	if err := c.catchUp(ctx); err != nil {
		return c.lastSigned(), false, err
	}
	token, err := c.lock(ctx)
	if err != nil {
		return c.lastSigned(), false, err
	}
	defer func() {
		// Release only our own lock (it may have expired and been taken).
		_ = unlockScript.Run(context.WithoutCancel(ctx), c.a.rdb, []string{c.lockKey}, token).Err()
	}()
	// Another replica may have signed since this one's last: chain on it.
	if err := c.adopt(ctx); err != nil {
		return c.lastSigned(), false, err
	}
	c.mu.Lock()
	last := c.last
	handedOver := last != nil && last.NextKey != "" && last.NextKey != c.ours
	c.mu.Unlock()
	if handedOver {
		return last, false, fmt.Errorf("%w: the chain was handed over to key %s (a rotation): restart with the new key", ErrCheckpointDiverged, keyIDOf(last.NextKey))
	}
	if err := c.check(ctx); err != nil {
		return last, false, err
	}
	c.mu.Lock()
	todo := len(c.seen)
	c.mu.Unlock()
	made := false
	for {
		c.mu.Lock()
		last := c.last
		n := min(todo, int(c.every))
		batch := slices.Clone(c.seen[:n])
		c.mu.Unlock()
		final := n == todo
		if n == 0 && (nextKey == "" || made) {
			return last, made, nil
		}
		next := ""
		if final {
			next = nextKey
		}
		cp, err := c.sign(ctx, last, batch, next)
		if err != nil {
			return last, made, err
		}
		if err := c.publish(ctx, cp); err != nil {
			return last, made, err
		}
		// Witnesses hold it: it is the checkpoint to build on, whether or
		// not Redis keeps its copy.
		c.mu.Lock()
		c.last, c.seen = &cp, slices.Delete(c.seen, 0, n)
		if n > 0 {
			c.base = cp.Head
		}
		c.mu.Unlock()
		made, todo = true, todo-n
		c.log.Info("audit checkpoint", "stream", c.a.stream, "seq", cp.Seq, "from", cp.From, "key_id", cp.KeyID)
		if err := c.keep(ctx, cp); err != nil {
			return &cp, made, err
		}
		if final {
			return &cp, made, nil
		}
	}
}

// lastSigned is the checkpoint built on (nil before the first).
func (c *Checkpointer) lastSigned() *approval.Checkpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// sign builds and signs the checkpoint after last covering batch (entries
// read, and checked since).
func (c *Checkpointer) sign(ctx context.Context, last *approval.Checkpoint, batch []seenEntry, nextKey string) (approval.Checkpoint, error) {
	cp := approval.Checkpoint{Stream: c.a.stream, MaxLen: c.maxLen, NextKey: nextKey, Time: c.now().Round(0), From: 1}
	if last != nil {
		cp.Seq, cp.EntryID, cp.Head, cp.From, cp.Prev = last.Seq, last.EntryID, last.Head, last.Seq+1, last.Hash()
		if cp.Time.Before(last.Time) {
			cp.Time = last.Time // another replica's clock ran ahead: never signed before the one it follows
		}
	} else if len(batch) > 0 {
		cp.From = batch[0].seq
	}
	cp.Hashes = make([]string, 0, len(batch))
	for _, e := range batch {
		cp.Hashes = append(cp.Hashes, approval.ShortHash(e.hash))
		cp.Seq, cp.EntryID, cp.Head = e.seq, e.id, e.hash
	}
	cp.Covered = approval.CoveredDigest(cp.Hashes)
	cp.First = cp.From
	if last != nil {
		cp.First = last.First
	}
	oldest, err := c.a.rdb.XRangeN(ctx, c.a.stream, "-", "+", 1).Result()
	if err != nil {
		return cp, fmt.Errorf("checkpoint read oldest entry: %w", err)
	}
	if len(oldest) == 1 {
		seq, perr := strconv.ParseInt(fmt.Sprint(oldest[0].Values[fieldSeq]), 10, 64)
		switch {
		case perr != nil || seq <= cp.First:
		case c.maxLen > 0:
			cp.First = seq // the writer's own trimming
		default:
			return cp, c.diverged("the stream starts at seq %d but the last checkpoint saw it start at seq %d, and this writer never trims: entries were deleted", seq, cp.First)
		}
	}
	return approval.SignCheckpoint(c.key, cp), nil
}

// keep stores cp in Redis (without its hashes) for the other replicas.
func (c *Checkpointer) keep(ctx context.Context, cp approval.Checkpoint) error {
	cp.Hashes = nil
	b, err := json.Marshal(cp)
	if err != nil {
		return fmt.Errorf("checkpoint encode: %w", err)
	}
	if err := c.a.rdb.Set(ctx, c.lastKey, b, 0).Err(); err != nil {
		return fmt.Errorf("checkpoint keep: %w", err)
	}
	c.mu.Lock()
	c.clearProblem(alarmStored)
	c.mu.Unlock()
	return nil
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

// lockScript takes the checkpoint lock for a while, or takes over a lock
// this process found was not written by a replica.
//
//	KEYS[1]   lock
//	ARGV[1]   the value to set (lockValue: signed, with its expiry)
//	ARGV[2]   its time to live, in ms
//	ARGV[3]   the value of a lock to take over ("" none): what the last
//	          reply said the lock held ("<type>" for a key not a string)
//
// Reply: {1} taken; {2} taken over; {0, value, pttl} held by value
// ("<type>" when the key is not a string), pttl ms to live (-1: none).
var lockScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1} end
local t = redis.call('TYPE', KEYS[1]).ok
local cur = '<' .. t .. '>'
if t == 'string' then cur = redis.call('GET', KEYS[1]) end
if ARGV[3] ~= '' and cur == ARGV[3] then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {2}
end
return {0, cur, redis.call('PTTL', KEYS[1])}
`)

// lock takes the checkpoint lock and returns its value. A lock held by a
// replica (signed with this key or the previous one, not expired) is
// ErrCheckpointBusy; one that is not (no expiry, a value no replica
// signed, a copy of an expired one, a key of another type) is taken over
// and raises the alarm: someone with write access to Redis tried to stop
// checkpoints.
func (c *Checkpointer) lock(ctx context.Context) (string, error) {
	value := c.lockValue(c.now())
	replace, why := "", ""
	for range 3 {
		res, err := lockScript.Run(ctx, c.a.rdb, []string{c.lockKey}, value, checkpointLockTTL.Milliseconds(), replace).Slice()
		if err != nil {
			return "", fmt.Errorf("checkpoint lock: %w", err)
		}
		code, _ := res[0].(int64)
		switch code {
		case 1:
			return value, nil
		case 2:
			text := fmt.Sprintf("took over the checkpoint lock %s, which no replica wrote (%s): someone with write access to Redis tried to stop checkpoints", c.lockKey, why)
			c.log.Error("audit checkpoint lock taken over", "stream", c.a.stream, "lock", c.lockKey, "why", why)
			c.mu.Lock()
			c.setProblem(alarmLock, text, c.bound)
			c.mu.Unlock()
			return value, nil
		}
		if len(res) < 3 {
			return "", fmt.Errorf("checkpoint lock: unexpected reply %v", res)
		}
		cur, _ := res[1].(string)
		pttl, _ := res[2].(int64)
		var ok bool
		if ok, why = c.replicaLock(cur, pttl); ok {
			return "", ErrCheckpointBusy
		}
		replace = cur
	}
	return "", ErrCheckpointBusy
}

// lockDomain separates a lock's signature from any other use of the key.
const lockDomain = "countersign audit checkpoint lock v1\n"

// lockValue is a lock value only a holder of the key can make: a nonce,
// its expiry (Unix ms) and their signature, for this lock key.
func (c *Checkpointer) lockValue(now time.Time) string {
	nonce, exp := newOp(), strconv.FormatInt(now.Add(checkpointLockTTL).UnixMilli(), 10)
	sig := ed25519.Sign(c.key, []byte(lockDomain+c.lockKey+"\n"+nonce+"\n"+exp))
	return nonce + " " + exp + " " + base64.RawStdEncoding.EncodeToString(sig)
}

// replicaLock reports whether value (with pttl ms to live) is a lock a
// replica holds, and why not.
func (c *Checkpointer) replicaLock(value string, pttl int64) (bool, string) {
	shown := strconv.Quote(clip.Bytes(value, 40))
	if pttl < 0 {
		return false, "it holds " + shown + " and has no expiry; a replica always sets one"
	}
	nonce, rest, _ := strings.Cut(value, " ")
	exp, sig64, _ := strings.Cut(rest, " ")
	sig, err := base64.RawStdEncoding.DecodeString(sig64)
	msg := []byte(lockDomain + c.lockKey + "\n" + nonce + "\n" + exp)
	signed := err == nil && (ed25519.Verify(c.pub, msg, sig) || (c.prevKey != nil && ed25519.Verify(c.prevKey, msg, sig)))
	if !signed {
		return false, "it holds " + shown + ", which no replica signed"
	}
	ms, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || c.now().After(time.UnixMilli(ms).Add(checkpointLockSkew)) {
		return false, "it holds a copy of a replica's lock that expired at " + time.UnixMilli(ms).UTC().Format(time.RFC3339)
	}
	return true, ""
}

// unlockScript deletes the lock if it still holds the caller's value.
//
//	KEYS[1]   lock
//	ARGV[1]   value
//
// Reply: 1 deleted, 0 not held by value.
var unlockScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)
