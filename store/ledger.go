package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/redis/go-redis/v9"
)

// Ledger is the lifecycle's record (approval.Records): the requests of a
// Store and the audit chain of an Audit, each transition one method that
// records it, writes its entry behind it and, when asked, pushes the
// wake-up behind the entry. It decides how many round trips that takes:
// on a single node without WaitReplicas, a decision expected to end the
// request and a claim go with their entry (and a decision's wake-up) in
// one pipeline (Audit.DecideAppendWake, Audit.ClaimAppend), a final
// transition's entry with its wake-up in another (Audit.AppendWake); on a
// Cluster, where the record and the chain are in different slots, or with
// replicas to confirm, one after the other. What is written is the same
// either way (TestLedgerOneWayOrAnother).
//
// The methods of Store it does not name (Request, CardBindings, Upkeep,
// grants, memory) are the Store's own.
type Ledger struct {
	*Store
	audit approval.Auditor
	chain *Audit // audit, when it is this package's: then entries can ride with transitions
}

// NewLedger returns the ledger of s and a (an *Audit in production; any
// approval.Auditor writes the same entries, one round trip each). An
// *Audit made without AuditOptions.Wakes rides its wake-ups with s's from
// now on (it must be on s's Redis client for them to share a round trip).
func NewLedger(s *Store, a approval.Auditor) *Ledger {
	l := &Ledger{Store: s, audit: a}
	if chain, ok := a.(*Audit); ok {
		if chain.wakes == nil {
			chain.wakes = s
		}
		l.chain = chain
	}
	return l
}

var _ approval.Records = (*Ledger)(nil)

// Append writes entries that are no transition, in order
// (approval.Records): in one round trip when the audit is an *Audit
// (Audit.AppendAll), else one after the other.
func (l *Ledger) Append(ctx context.Context, rs ...approval.Record) error {
	if l.chain != nil {
		_, err := l.chain.AppendAll(ctx, rs)
		return err
	}
	for _, r := range rs {
		if _, err := l.audit.Append(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

// AppendNew writes rs as Append does, only while no request has id
// (approval.Records): a call settled without a request (let through or
// refused by the gate) whose id names the call. On a single node with
// the audit on this store's client the check rides with the entries in
// their group commit (absentAppendScript: one round trip); elsewhere (a
// Cluster: the record and the chain are in different slots) the record
// is read first. When a request has id: that request and
// approval.ErrExists, nothing written.
func (l *Ledger) AppendNew(ctx context.Context, id string, rs ...approval.Record) (*approval.Request, error) {
	_, cluster := l.rdb.(*redis.ClusterClient)
	if l.chain == nil || l.chain.rdb != l.rdb || cluster {
		got, err := l.Store.Request(ctx, id)
		switch {
		case err == nil:
			return got, approval.ErrExists
		case !errors.Is(err, approval.ErrNotFound):
			return nil, err
		}
		return nil, l.Append(ctx, rs...)
	}
	for range 3 {
		_, err := l.chain.appendAll(ctx, rs, l.k.request(id))
		if !errors.Is(err, errTaken) {
			return nil, err
		}
		got, err := l.Store.Request(ctx, id)
		if !errors.Is(err, approval.ErrNotFound) {
			return got, cmp.Or(err, approval.ErrExists)
		}
		// Gone since (its retention ended, or Redis lost it): no request
		// has id now, so the entries may be written.
	}
	return nil, fmt.Errorf("append for call %s: its record's key exists but holds no request", id)
}

// auditTimeout bounds an entry written behind a transition that took:
// with a context that outlives the caller's, since what it describes has
// happened.
const auditTimeout = 5 * time.Second

// behind writes rec (about after, which a transition just left as it is)
// and, with wake, after's wake-up behind it: in one round trip where the
// audit can (AppendWake), else the entry, then the wake-up. A failed
// entry is logged (the transition stands); the error is the wake-up's.
func (l *Ledger) behind(ctx context.Context, after *approval.Request, rec *approval.Record, wake bool) error {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), auditTimeout)
	defer cancel()
	woke := false
	if rec != nil {
		if rec.TraceID == "" {
			rec.TraceID = after.TraceID
		}
		var err error
		if wake && l.chain != nil {
			_, woke, err = l.chain.AppendWake(actx, *rec, after.ID, after.Status)
		} else {
			_, err = l.audit.Append(actx, *rec)
		}
		if err != nil {
			l.log.ErrorContext(ctx, "audit append failed", "event", rec.Event, "request_id", rec.RequestID, "run_id", rec.RunID, "err", err)
		}
	}
	if !wake || woke {
		return nil
	}
	err := l.Store.Wake(actx, after.ID, after.Status)
	if err != nil {
		l.log.WarnContext(ctx, "wake-up not pushed; waiters find the decision at their next re-read", "request_id", after.ID, "err", err)
	}
	return err
}

// took writes what follows a transition that left the request as after
// (err nil), or that found it past its deadline and ended it itself (a
// *approval.DecidedError with Now): its entry (p.Entry, p.Elapsed) and,
// with p.Wake, the wake-up of a request now final, unless p.Hold keeps an
// approval's for the caller. It returns after and err, and the wake-up's
// error (RecordDecision's ErrNotReplicated; the others' is logged).
func (l *Ledger) took(ctx context.Context, p approval.Prepared, after *approval.Request, err error) (*approval.Request, error, error) {
	build := p.Entry
	var de *approval.DecidedError
	switch {
	case err == nil:
	case errors.As(err, &de) && de.Now && after != nil:
		build = p.Elapsed
	default:
		return after, err, nil
	}
	var rec *approval.Record
	if build != nil {
		r := build(after)
		rec = &r
	}
	wake := p.Wake && after.Status.Decided() && !(p.Hold && after.Status == approval.StatusApproved && err == nil)
	return after, err, l.behind(ctx, after, rec, wake)
}

// done is took for a transition whose wake-up error is only logged.
func (l *Ledger) done(ctx context.Context, p approval.Prepared, after *approval.Request, err error) (*approval.Request, error) {
	after, err, _ = l.took(ctx, p, after, err)
	return after, err
}

// oneTrip reports whether a transition's entry (and its wake-up) can go
// in the transition's round trip: a single node, no WAIT, the audit on
// this store's client.
func (l *Ledger) oneTrip() bool {
	return l.chain != nil && l.chain.wakes == l.Store && l.chain.rdb == l.rdb && l.wakesWith()
}

// CreateRequest saves r (Store.CreateRequest) and writes entries(r)
// behind it.
func (l *Ledger) CreateRequest(ctx context.Context, r *approval.Request, entries func(*approval.Request) []approval.Record) error {
	if err := l.Store.CreateRequest(ctx, r); err != nil {
		return err
	}
	if entries == nil {
		return nil
	}
	for _, rec := range entries(r) {
		_ = l.behind(ctx, r, &rec, false)
	}
	return nil
}

// RecordDecision records d (Store.RecordDecision) and what follows it
// (approval.Records). A decision whose outcome p guesses goes with its
// entry and wake-up in one round trip where the topology allows
// (Audit.DecideAppendWake); any other outcome is recorded, then audited
// from the record.
func (l *Ledger) RecordDecision(ctx context.Context, d approval.Decision, p approval.Prepared) (*approval.Request, error) {
	if g := p.Guess; g != nil && p.Entry != nil && p.Wake && !p.Hold && l.oneTrip() {
		rec := p.Entry(g)
		if rec.TraceID == "" {
			rec.TraceID = g.TraceID
		}
		after, _, appended, woke, err := l.chain.DecideAppendWake(ctx, d, rec, g.Status, g.Digest)
		if err == nil && appended {
			if !woke {
				_ = l.behind(ctx, after, nil, true) // logged; waiters re-read records
			}
			return after, nil
		}
		return l.decided(ctx, p, after, err)
	}
	after, err := l.Store.RecordDecision(ctx, d)
	return l.decided(ctx, p, after, err)
}

// decided is took for a decision: a wake-up whose replicas did not
// confirm the decision that took is the caller's error (the clicker is
// told to decide again), with the request decided.
func (l *Ledger) decided(ctx context.Context, p approval.Prepared, after *approval.Request, err error) (*approval.Request, error) {
	after, err, werr := l.took(ctx, p, after, err)
	if err == nil && errors.Is(werr, ErrNotReplicated) {
		return after, fmt.Errorf("decide %s: %w", after.ID, werr)
	}
	return after, err
}

// RecordExpiries ends every request due at now (Store.RecordExpiries)
// and writes, for each, p.Elapsed's entry and its wake-up.
func (l *Ledger) RecordExpiries(ctx context.Context, now time.Time, p approval.Prepared) ([]*approval.Request, error) {
	ended, err := l.Store.RecordExpiries(ctx, now)
	for _, r := range ended {
		var rec *approval.Record
		if p.Elapsed != nil {
			e := p.Elapsed(r)
			rec = &e
		}
		_ = l.behind(ctx, r, rec, p.Wake) // logged
	}
	return ended, err
}

// RecordCancel cancels request id (Store.RecordCancel) and writes what
// follows.
func (l *Ledger) RecordCancel(ctx context.Context, id, by, reason string, p approval.Prepared) (*approval.Request, error) {
	r, err := l.Store.RecordCancel(ctx, id, by, reason)
	return l.done(ctx, p, r, err)
}

// Claim claims request id (Store.Claim) and writes its entry: in the
// claim's round trip where the topology allows (Audit.ClaimAppend: the
// entry is written only if that claim took with digest's arguments),
// else behind it.
func (l *Ledger) Claim(ctx context.Context, id, owner, tokenHash, digest string, p approval.Prepared) (*approval.Request, error) {
	if p.Guess != nil && p.Entry != nil && digest != "" && l.oneTrip() {
		rec := p.Entry(p.Guess)
		if rec.TraceID == "" {
			rec.TraceID = p.Guess.TraceID
		}
		got, _, appended, err := l.chain.ClaimAppend(ctx, rec, id, owner, tokenHash, digest)
		if err != nil || appended {
			return got, err
		}
		return l.done(ctx, p, got, nil)
	}
	got, err := l.Store.Claim(ctx, id, owner, tokenHash, digest)
	return l.done(ctx, p, got, err)
}

// Refuse ends request id refused (Store.Refuse) and writes what follows.
func (l *Ledger) Refuse(ctx context.Context, id, digest, why string, p approval.Prepared) (*approval.Request, error) {
	r, err := l.Store.Refuse(ctx, id, digest, why)
	return l.done(ctx, p, r, err)
}

// Reopen takes request id back to pending (Store.Reopen) and writes what
// follows.
func (l *Ledger) Reopen(ctx context.Context, id, digest string, ro approval.Reopening, p approval.Prepared) (*approval.Request, error) {
	r, err := l.Store.Reopen(ctx, id, digest, ro)
	return l.done(ctx, p, r, err)
}

// Finish records the outcome of request id (Store.Finish) and writes what
// follows.
func (l *Ledger) Finish(ctx context.Context, id string, st approval.Status, result string, p approval.Prepared) (*approval.Request, error) {
	r, err := l.Store.Finish(ctx, id, st, result)
	return l.done(ctx, p, r, err)
}

// RecordFeedback records f on request id (Store.RecordFeedback) and
// writes what follows.
func (l *Ledger) RecordFeedback(ctx context.Context, id string, f approval.Feedback, p approval.Prepared) (*approval.Request, error) {
	r, err := l.Store.RecordFeedback(ctx, id, f)
	return l.done(ctx, p, r, err)
}
