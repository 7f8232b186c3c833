package store_test

import (
	"context"
	"errors"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// The store's tests change request state the way production does: the
// lifecycle owner (approval.Lifecycle) records a transition with one
// script, audits it, then pushes its wake-up. These helpers are those
// steps without the audit entry and the card, which are not the store's.

// decide records d (Store.RecordDecision) and, when the decision made the
// request final or found it due and expired it there, pushes its wake-up
// (Store.Wake), as approval.Lifecycle.Decide does. A failed wake-up is
// returned (the lifecycle logs it, or returns it with WaitReplicas).
func decide(ctx context.Context, s *store.Store, d approval.Decision) (*approval.Request, error) {
	r, err := s.RecordDecision(ctx, d)
	var de *approval.DecidedError
	switch {
	case err == nil && r.Status != approval.StatusPending, errors.As(err, &de) && de.Now && r != nil:
		if werr := s.Wake(ctx, r.ID, r.Status); werr != nil {
			return r, errors.Join(err, werr)
		}
	}
	return r, err
}

// expireDue expires every request due at now (Store.RecordExpiries) and
// pushes each one's wake-up, as approval.Lifecycle.ExpireDue does.
func expireDue(ctx context.Context, s *store.Store, now time.Time) ([]*approval.Request, error) {
	out, err := s.RecordExpiries(ctx, now)
	for _, r := range out {
		if werr := s.Wake(ctx, r.ID, r.Status); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	return out, err
}

// cancelRequest cancels request id (Store.RecordCancel) and pushes its
// wake-up, as approval.Lifecycle.Cancel does.
func cancelRequest(ctx context.Context, s *store.Store, id, by, reason string) (*approval.Request, error) {
	r, err := s.RecordCancel(ctx, id, by, reason)
	if err != nil {
		return r, err
	}
	if werr := s.Wake(ctx, id, r.Status); werr != nil {
		return r, werr
	}
	return r, nil
}
