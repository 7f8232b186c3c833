package approvaltest

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/countersign/countersign/approval"
)

// Cards is an in-memory approval.Cards: a card writer that "posts" each
// card as a made-up message and remembers what it was asked, as the bot
// does against Slack (it writes no record: the lifecycle binds). It is
// safe for concurrent use.
type Cards struct {
	// OnPost, when set, runs inside Post once the message is up and
	// before Post answers (a click binding it meanwhile); an error makes
	// Post fail as Slack refusing would, the message not left up.
	OnPost func(r *approval.Request, c approval.CardRef) error

	mu        sync.Mutex                     // guards the fields below
	n         int                            // messages posted
	screen    map[string][]approval.CardRef  // messages up, by request id
	deleted   []approval.CardRef             // messages deleted
	told      map[string]int                 // Posted calls, by request id
	refreshed map[string][]*approval.Request // Refresh calls, by request id
}

var _ approval.Cards = (*Cards)(nil)

// NewCards returns a card writer with nothing posted.
func NewCards() *Cards {
	return &Cards{screen: map[string][]approval.CardRef{}, told: map[string]int{}, refreshed: map[string][]*approval.Request{}}
}

// Post puts a new message up as r's card; with again, r's card already up
// (an earlier attempt's) is returned instead, found.
func (c *Cards) Post(_ context.Context, r *approval.Request, again bool) (approval.CardRef, bool, error) {
	c.mu.Lock()
	if up := c.screen[r.ID]; again && len(up) > 0 {
		c.mu.Unlock()
		return up[0], true, nil
	}
	c.n++
	ref := approval.CardRef{Channel: "G0APPROV", TS: fmt.Sprintf("1700000000.%06d", c.n)}
	c.screen[r.ID] = append(c.screen[r.ID], ref)
	hook := c.OnPost
	c.mu.Unlock()
	if hook != nil {
		if err := hook(r, ref); err != nil {
			c.Delete(context.Background(), r, ref)
			return approval.CardRef{}, false, err
		}
	}
	return ref, false, nil
}

// Posted counts the waiting notes r's task thread was told.
func (c *Cards) Posted(_ context.Context, r *approval.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.told[r.ID]++
}

// Delete takes message ref down.
func (c *Cards) Delete(_ context.Context, r *approval.Request, ref approval.CardRef) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.screen[r.ID] = slices.DeleteFunc(c.screen[r.ID], func(x approval.CardRef) bool { return x == ref })
	c.deleted = append(c.deleted, ref)
}

// Refresh records the copy it was given.
func (c *Cards) Refresh(r *approval.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshed[r.ID] = append(c.refreshed[r.ID], r)
}

// Up returns the messages up as request id's card, oldest first.
func (c *Cards) Up(id string) []approval.CardRef {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.screen[id])
}

// Deleted returns the messages taken down, in order.
func (c *Cards) Deleted() []approval.CardRef {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.deleted)
}

// Told returns how many times request id's task thread was told it waits.
func (c *Cards) Told(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.told[id]
}

// Refreshed returns how many redraws of request id's card were asked.
func (c *Cards) Refreshed(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.refreshed[id])
}

// Last returns the latest copy a redraw of request id's card was asked
// with, nil when none was.
func (c *Cards) Last(id string) *approval.Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rs := c.refreshed[id]; len(rs) > 0 {
		return rs[len(rs)-1]
	}
	return nil
}
