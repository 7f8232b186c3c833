package approvaltest

import (
	"context"
	"errors"
	"time"

	"github.com/countersign/countersign/approval"
)

// Ledger is approval.Records over the in-memory Records and an Auditor:
// each transition of the Records, then its entry, then its wake-up, one
// after the other (store.Ledger's way on a Cluster).
type Ledger struct {
	*Records
	Audit approval.Auditor
}

// NewLedger returns the ledger of rec and audit.
func NewLedger(rec *Records, audit approval.Auditor) *Ledger {
	return &Ledger{Records: rec, Audit: audit}
}

var _ approval.Records = (*Ledger)(nil)

// Append writes an entry that is no transition.
func (l *Ledger) Append(ctx context.Context, r approval.Record) (approval.Entry, error) {
	return l.Audit.Append(ctx, r)
}

// took writes what follows a transition (see store.Ledger).
func (l *Ledger) took(ctx context.Context, p approval.Prepared, after *approval.Request, err error) (*approval.Request, error) {
	build := p.Entry
	var de *approval.DecidedError
	switch {
	case err == nil:
	case errors.As(err, &de) && de.Now && after != nil:
		build = p.Elapsed
	default:
		return after, err
	}
	if build != nil {
		rec := build(after)
		if rec.TraceID == "" {
			rec.TraceID = after.TraceID
		}
		_, _ = l.Audit.Append(context.WithoutCancel(ctx), rec)
	}
	if p.Wake && after.Status.Decided() && !(p.Hold && after.Status == approval.StatusApproved && err == nil) {
		if werr := l.Records.Wake(ctx, after.ID, after.Status); werr != nil && err == nil {
			return after, werr
		}
	}
	return after, err
}

// CreateRequest saves r and writes entries(r).
func (l *Ledger) CreateRequest(ctx context.Context, r *approval.Request, entries func(*approval.Request) []approval.Record) error {
	if err := l.Records.CreateRequest(ctx, r); err != nil {
		return err
	}
	if entries != nil {
		for _, rec := range entries(r) {
			if rec.TraceID == "" {
				rec.TraceID = r.TraceID
			}
			_, _ = l.Audit.Append(context.WithoutCancel(ctx), rec)
		}
	}
	return nil
}

// RecordDecision records d, then what follows.
func (l *Ledger) RecordDecision(ctx context.Context, d approval.Decision, p approval.Prepared) (*approval.Request, error) {
	r, err := l.Records.RecordDecision(ctx, d)
	return l.took(ctx, p, r, err)
}

// RecordExpiries ends what is due, then writes each one's entry and
// wake-up.
func (l *Ledger) RecordExpiries(ctx context.Context, now time.Time, p approval.Prepared) ([]*approval.Request, error) {
	ended, err := l.Records.RecordExpiries(ctx, now)
	for _, r := range ended {
		_, _ = l.took(ctx, approval.Prepared{Entry: p.Elapsed, Wake: p.Wake}, r, nil)
	}
	return ended, err
}

// RecordCancel cancels, then what follows.
func (l *Ledger) RecordCancel(ctx context.Context, id, by, reason string, p approval.Prepared) (*approval.Request, error) {
	r, err := l.Records.RecordCancel(ctx, id, by, reason)
	return l.took(ctx, p, r, err)
}

// Claim claims, then what follows.
func (l *Ledger) Claim(ctx context.Context, id, owner, tokenHash, digest string, p approval.Prepared) (*approval.Request, error) {
	r, err := l.Records.Claim(ctx, id, owner, tokenHash, digest)
	return l.took(ctx, p, r, err)
}

// Refuse refuses, then what follows.
func (l *Ledger) Refuse(ctx context.Context, id, digest, why string, p approval.Prepared) (*approval.Request, error) {
	r, err := l.Records.Refuse(ctx, id, digest, why)
	return l.took(ctx, p, r, err)
}

// Reopen reopens, then what follows.
func (l *Ledger) Reopen(ctx context.Context, id, digest string, ro approval.Reopening, p approval.Prepared) (*approval.Request, error) {
	r, err := l.Records.Reopen(ctx, id, digest, ro)
	return l.took(ctx, p, r, err)
}

// Finish finishes, then what follows.
func (l *Ledger) Finish(ctx context.Context, id string, st approval.Status, result string, p approval.Prepared) (*approval.Request, error) {
	r, err := l.Records.Finish(ctx, id, st, result)
	return l.took(ctx, p, r, err)
}

// RecordFeedback records f, then what follows.
func (l *Ledger) RecordFeedback(ctx context.Context, id string, f approval.Feedback, p approval.Prepared) (*approval.Request, error) {
	r, err := l.Records.RecordFeedback(ctx, id, f)
	return l.took(ctx, p, r, err)
}
