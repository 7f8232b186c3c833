package approvaltest

import (
	"context"
	"sync"
	"time"

	"github.com/countersign/countersign/approval"
)

// StepUps is approval.StepUps in memory, with the store's refusals: a link
// is read once by TakeStepUpLink, and is gone after its Expires by the
// clock given.
type StepUps struct {
	now func() time.Time

	mu    sync.Mutex // guards the maps below
	links map[string]approval.StepUpLink
	fresh map[string]time.Time
}

// NewStepUps returns an empty StepUps on clock now (time.Now when nil).
func NewStepUps(now func() time.Time) *StepUps {
	if now == nil {
		now = time.Now
	}
	return &StepUps{now: now, links: map[string]approval.StepUpLink{}, fresh: map[string]time.Time{}}
}

var _ approval.StepUps = (*StepUps)(nil)

// SaveStepUpLink keeps link under key.
func (s *StepUps) SaveStepUpLink(_ context.Context, key string, link approval.StepUpLink) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.links[key] = link
	return nil
}

func (s *StepUps) get(key string, take bool) (approval.StepUpLink, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	link, ok := s.links[key]
	if !ok || !s.now().Before(link.Expires) {
		return approval.StepUpLink{}, approval.ErrNotFound
	}
	if take {
		delete(s.links, key)
	}
	return link, nil
}

// StepUpLink reads a link without using it.
func (s *StepUps) StepUpLink(_ context.Context, key string) (approval.StepUpLink, error) {
	return s.get(key, false)
}

// TakeStepUpLink reads and deletes a link.
func (s *StepUps) TakeStepUpLink(_ context.Context, key string) (approval.StepUpLink, error) {
	return s.get(key, true)
}

// NoteStepUp remembers user's confirmation until until.
func (s *StepUps) NoteStepUp(_ context.Context, user string, until time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fresh[user] = until
	return nil
}

// SteppedUp returns until when user's confirmation covers further votes.
func (s *StepUps) SteppedUp(_ context.Context, user string) (time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fresh[user], nil
}

// Links is how many links are kept (used ones are gone).
func (s *StepUps) Links() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.links)
}
