package api

// This file: what a caller reads and withdraws of its own requests (the
// list of its pending requests, and its cancel).

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
)

// List page sizes (?limit=).
const (
	DefaultListLimit = 50
	MaxListLimit     = 100
)

// ListView is the answer of GET /v1/requests: one page of the key's
// requests, oldest first, and the cursor of the next page ("" on the
// last).
type ListView = client.Page

// list is GET /v1/requests?status=pending: the key's own pending
// requests (never another key's), oldest first, in pages of ?limit= with
// the opaque ?cursor= of the page before.
func (s *Server) list(w http.ResponseWriter, r *http.Request, c call) {
	q := r.URL.Query()
	bad := func(field, format string, args ...any) {
		s.refuse(w, r, c, http.StatusBadRequest, ErrorDetail{Code: "invalid_field", Field: field, Message: fmt.Sprintf(format, args...)})
	}
	if st := q.Get("status"); st != "" && st != string(approval.StatusPending) {
		bad("status", "status %q cannot be listed: only pending requests are (status=pending); read a final one by its id", st)
		return
	}
	limit := DefaultListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxListLimit {
			bad("limit", "limit %q is not a number from 1 to %d", v, MaxListLimit)
			return
		}
		limit = n
	}
	after, ok := parseCursor(q.Get("cursor"))
	if !ok {
		bad("cursor", "cursor is not one this API gave (next_cursor of the page before)")
		return
	}
	all, err := s.req.Pending(r.Context())
	if err != nil {
		s.fail(w, r, c, "list pending", err)
		return
	}
	var mine []*approval.Request
	for _, req := range all {
		if req.Caller.Kind == approval.CallerAPI && req.Caller.Name == c.key.Name && after.before(req) {
			mine = append(mine, req)
		}
	}
	slices.SortFunc(mine, func(a, b *approval.Request) int {
		return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.ID, b.ID))
	})
	out := ListView{Requests: []RequestView{}}
	if len(mine) > limit {
		mine = mine[:limit]
		last := mine[limit-1]
		out.NextCursor = cursor{created: last.Created, id: last.ID}.String()
	}
	for _, req := range mine {
		out.Requests = append(out.Requests, s.show(r.Context(), req))
	}
	writeJSON(w, http.StatusOK, out)
}

// cursor is where a page of the list ended: its last request's creation
// time and id (requests are listed by both, so a request that became
// final in between moves no other one).
type cursor struct {
	created time.Time
	id      string
}

// String encodes c for ?cursor=.
func (c cursor) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.created.UnixNano(), 10) + " " + c.id))
}

// before reports whether r comes after the cursor (the zero cursor is
// before every request).
func (c cursor) before(r *approval.Request) bool {
	if c.id == "" {
		return true
	}
	return cmp.Or(r.Created.Compare(c.created), strings.Compare(r.ID, c.id)) > 0
}

// parseCursor reads ?cursor= ("" is the first page).
func parseCursor(s string) (cursor, bool) {
	if s == "" {
		return cursor{}, true
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return cursor{}, false
	}
	nanos, id, ok := strings.Cut(string(b), " ")
	n, err := strconv.ParseInt(nanos, 10, 64)
	if !ok || err != nil || id == "" {
		return cursor{}, false
	}
	return cursor{created: time.Unix(0, n), id: id}, true
}

// withdrawnWhy is the reason a request withdrawn by its caller shows on
// its card, in the audit and to its caller.
func withdrawnWhy(c call) string {
	return "Withdrawn by the caller (key " + c.key.Name + ") — nothing ran"
}

// gaveUpWhy is the reason of a request whose caller stopped waiting for
// the decision (Withdrawal.GaveUp).
func gaveUpWhy(key string) string {
	return "The caller gave up waiting (key " + key + "); nothing ran"
}

// WithdrawalInput is the body of POST /v1/requests/{id}/cancel (none is
// needed). It is the Go client's Withdrawal.
type WithdrawalInput = client.Withdrawal

// cancel is POST /v1/requests/{id}/cancel: the caller withdraws its
// pending request (it no longer wants the call, or, with gave_up, it
// stopped waiting). The lifecycle records it as cancelled, audits it,
// wakes the waiters and redraws the card; nothing runs. A request that is
// no longer pending is 409 not_pending, with the request as it now is.
func (s *Server) cancel(w http.ResponseWriter, r *http.Request, c call) {
	var in WithdrawalInput
	if !s.decodeOptional(w, r, c, &in) {
		return
	}
	req, ok := s.own(w, r, c)
	if !ok {
		return
	}
	why := withdrawnWhy(c)
	if in.GaveUp {
		why = gaveUpWhy(c.key.Name)
	}
	s.withdraw(w, r, c, req, why)
}

// withdraw ends req, pending when read, cancelled for why, and answers
// it (409 not_pending when a decision came first).
func (s *Server) withdraw(w http.ResponseWriter, r *http.Request, c call, req *approval.Request, why string) {
	notPending := func(cur *approval.Request) {
		v := s.show(r.Context(), cur)
		s.refuseWith(w, r, c, http.StatusConflict, ErrorDetail{Code: "not_pending",
			Message: fmt.Sprintf("the request is %s, no longer pending: it cannot be withdrawn; its state is in request", cur.Status)}, &v)
	}
	if req.Status != approval.StatusPending {
		notPending(req)
		return
	}
	got, err := s.life.Cancel(r.Context(), req.ID, owner(c.key), why)
	if _, ok := errors.AsType[*approval.DecidedError](err); ok {
		// A decision came first: the request is what it made it.
		if got == nil {
			got = req
		}
		notPending(got)
		return
	}
	if err != nil {
		s.fail(w, r, c, "cancel", err)
		return
	}
	s.log.Info("api request withdrawn", "request_id", req.ID, "http_request_id", c.id, "key", c.key.Name, "actor", owner(c.key), "reason", why)
	writeJSON(w, http.StatusOK, s.show(r.Context(), got))
}

// decodeOptional is decode for a body that may be left out: no body, or
// only white space, leaves v as it is.
func (s *Server) decodeOptional(w http.ResponseWriter, r *http.Request, c call, v any) bool {
	if _, handed := client.Body(r.Context()); handed {
		return s.decode(w, r, c, v) // a body handed over in this process (client.InProcess)
	}
	if r.ContentLength == 0 {
		return true
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	if err == nil && len(bytes.TrimSpace(body)) == 0 {
		return true
	}
	// decode reads it again, and answers a read error as it would have.
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), failingReader{err}))
	return s.decode(w, r, c, v)
}

// failingReader returns err (io.EOF when nil).
type failingReader struct{ err error }

func (f failingReader) Read([]byte) (int, error) {
	if f.err == nil {
		return 0, io.EOF
	}
	return 0, f.err
}
