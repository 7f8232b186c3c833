package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
)

// Page is one page of List: the key's pending requests, oldest first, and
// the cursor of the next page ("" on the last).
type Page struct {
	Requests   []Request `json:"requests"`
	NextCursor string    `json:"next_cursor,omitempty"`
}

// List returns one page of the key's own pending requests (never another
// key's), oldest first: limit of them (0: the server's default, 50; at
// most 100), after cursor ("" for the first page; then Page.NextCursor).
func (cl *Client) List(ctx context.Context, limit int, cursor string) (*Page, error) {
	q := url.Values{"status": {string(Pending)}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	var p Page
	if err := cl.do(ctx, http.MethodGet, "/v1/requests?"+q.Encode(), nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Cancel withdraws a pending request the caller no longer wants: it ends
// cancelled (its card says it was withdrawn by the caller), nothing runs,
// and every waiter is told. A request that is no longer pending is
// refused with an *Error (HTTP 409, not_pending) whose Request is the
// request as it now is: if it was approved meanwhile, the caller still
// decides whether to claim it.
func (cl *Client) Cancel(ctx context.Context, id string) (*Request, error) {
	return cl.cancel(ctx, id, Withdrawal{})
}

// GiveUp is Cancel for a caller that stopped waiting for a decision (its
// own deadline passed, it is being stopped): the card says the caller
// gave up and nothing ran. Its answers are Cancel's.
func (cl *Client) GiveUp(ctx context.Context, id string) (*Request, error) {
	return cl.cancel(ctx, id, Withdrawal{GaveUp: true})
}

// Withdrawal is the body of a cancel (none is needed).
type Withdrawal struct {
	// GaveUp says the caller stopped waiting (rather than no longer
	// wanting the call): the card and the audit say it gave up.
	GaveUp bool `json:"gave_up,omitempty"`
}

func (cl *Client) cancel(ctx context.Context, id string, w Withdrawal) (*Request, error) {
	var r Request
	if err := cl.do(ctx, http.MethodPost, "/v1/requests/"+url.PathEscape(id)+"/cancel", w, &r); err != nil {
		return nil, err
	}
	return &r, nil
}
