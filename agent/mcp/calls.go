package mcp

import (
	"container/list"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
)

// This file: the call ids of calls not yet answered, kept in bounded
// memory.

// MaxPendingCalls bounds the calls the gateway remembers as not yet
// answered (their call ids, so a retry finds its request). A call is
// forgotten once it is answered; one whose client went away and never
// retried is forgotten when MaxPendingCalls newer ones are pending: its
// retry after that is a new request.
const MaxPendingCalls = 10000

// pendingCalls maps a call's key (session, tool, arguments) to the call id
// of its request while the call is not answered. It is bounded: the least
// recently asked key goes first. Not safe for concurrent use: Gateway.mu
// guards it.
type pendingCalls struct {
	max   int
	ids   map[string]*list.Element // key → its element in order
	order *list.List               // of *pendingCall, least recently asked first
}

type pendingCall struct{ key, id string }

func newPendingCalls(max int) *pendingCalls {
	return &pendingCalls{max: max, ids: map[string]*list.Element{}, order: list.New()}
}

// id returns the call id of key's pending call, making a new one (never
// used before: random) when none is pending.
func (p *pendingCalls) id(key string) string {
	if e, ok := p.ids[key]; ok {
		p.order.MoveToBack(e)
		return e.Value.(*pendingCall).id
	}
	c := &pendingCall{key: key, id: key + ":" + strings.ToLower(rand.Text()[:10])}
	p.ids[key] = p.order.PushBack(c)
	for p.order.Len() > p.max {
		old := p.order.Remove(p.order.Front()).(*pendingCall)
		delete(p.ids, old.key)
	}
	return c.id
}

// answered forgets key's pending call: the next identical call is new.
func (p *pendingCalls) answered(key string) {
	if e, ok := p.ids[key]; ok {
		p.order.Remove(e)
		delete(p.ids, key)
	}
}

func (p *pendingCalls) len() int { return p.order.Len() }

// callID is a stable id for a call: the same tool and arguments in the
// same session map to the same request until that call is answered, so a
// retried call (the client cancelled, or its connection dropped before
// the answer) finds its request and never makes a second card; the next
// identical call after an answer is a new request.
func (g *Gateway) callID(run, tool string, args json.RawMessage) (key, id string) {
	sum := sha256.Sum256(append([]byte(tool+"\x00"), args...))
	key = run + ":" + hex.EncodeToString(sum[:12])
	g.mu.Lock()
	defer g.mu.Unlock()
	return key, g.pending.id(key)
}

// done forgets an answered call, so the next identical call is new.
func (g *Gateway) done(key string) {
	g.mu.Lock()
	g.pending.answered(key)
	g.mu.Unlock()
}
