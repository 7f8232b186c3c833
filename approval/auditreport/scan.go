package auditreport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/countersign/countersign/approval"
)

// Ranger pages the audit stream oldest first; *store.Audit provides it.
type Ranger interface {
	// Range returns up to count entries after the stream id afterID ("" =
	// from the beginning), oldest first. An error means the stream could
	// not be read.
	Range(ctx context.Context, afterID string, count int64) ([]approval.Entry, error)
}

// Page is how many entries one Range call of Scan reads; no reader here
// holds more than two pages of entries, the one it reads and the one
// Scan fetches meanwhile (a story keeps the matching ones only).
const Page = 1000

// SinceSkew widens the stream-id range start of a time window: stream ids
// come from the Redis clock, entry times from the writer's, and the entry
// time decides.
const SinceSkew = 5 * time.Minute

// errStopScan ends a scan early.
var errStopScan = errors.New("stop scan")

// Scan calls fn for every entry after afterID, oldest first, one page of
// Page entries at a time. It returns the first error of r or fn.
//
// While fn reads a page, the next one is fetched: Redis serialising a
// page, the network and the reply's parsing overlap with fn's work (a
// replay of 100,000 calls spent a third of its time waiting on pages).
// One Range call runs at a time, never two; the fetch ends before Scan
// returns.
func Scan(ctx context.Context, r Ranger, afterID string, fn func(approval.Entry) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type fetched struct {
		page []approval.Entry
		err  error
	}
	fetch := func(after string) <-chan fetched {
		c := make(chan fetched, 1)
		// Exits when Range returns (cancelled with ctx); the buffer
		// lets it exit even when nobody reads.
		go func() {
			page, err := r.Range(ctx, after, Page)
			c <- fetched{page, err}
		}()
		return c
	}
	next := fetch(afterID)
	for next != nil {
		f := <-next
		if f.err != nil {
			return f.err
		}
		next = nil
		if len(f.page) == Page {
			next = fetch(f.page[len(f.page)-1].ID)
		}
		for _, e := range f.page {
			if err := fn(e); err != nil {
				if next != nil {
					cancel()
					<-next // the fetch has ended: nothing outlives Scan
				}
				return err
			}
		}
	}
	return nil
}

// RevRanger pages the audit stream newest first; *store.Audit provides it.
type RevRanger interface {
	// RevRange returns up to count entries before the stream id beforeID
	// ("" = from the end), newest first.
	RevRange(ctx context.Context, beforeID string, count int64) ([]approval.Entry, error)
}

// Last returns the last n entries of the stream, oldest first (what
// `audit tail` shows before it follows).
func Last(ctx context.Context, r RevRanger, n int) ([]approval.Entry, error) {
	var last []approval.Entry
	for before := ""; len(last) < n; {
		page, err := r.RevRange(ctx, before, int64(min(n-len(last), Page)))
		if err != nil {
			return nil, err
		}
		last = append(last, page...)
		if len(page) == 0 {
			break
		}
		before = page[len(page)-1].ID
	}
	slices.Reverse(last)
	return last, nil
}

// ScanSince calls fn for entries stamped at or after since. The scan
// starts at the stream id of since (less SinceSkew), so older entries are
// never read.
func ScanSince(ctx context.Context, r Ranger, since time.Time, fn func(approval.Entry) error) error {
	return Scan(ctx, r, StreamIDBefore(since.Add(-SinceSkew)), func(e approval.Entry) error {
		if e.Time.Before(since) {
			return nil
		}
		return fn(e)
	})
}

// StreamIDBefore is the largest stream id before every id of time t, for
// use as an exclusive range start; "" (the beginning) for times before
// the epoch.
func StreamIDBefore(t time.Time) string {
	ms := t.UnixMilli()
	if ms <= 0 {
		return ""
	}
	return strconv.FormatInt(ms-1, 10) + "-18446744073709551615"
}

// IDBefore is the largest stream id smaller than id ("" when there is
// none), so Range(IDBefore(id), 1) reads the entry at id.
func IDBefore(id string) string {
	msStr, seqStr, ok := strings.Cut(id, "-")
	ms, err1 := strconv.ParseUint(msStr, 10, 64)
	seq, err2 := strconv.ParseUint(seqStr, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return ""
	}
	if seq > 0 {
		return fmt.Sprintf("%d-%d", ms, seq-1)
	}
	if ms == 0 {
		return ""
	}
	return fmt.Sprintf("%d-18446744073709551615", ms-1)
}

// ReadStory reads the whole story of request id: every entry of it, kept in
// the trail, and the requester (from the run's run_started entry when the
// request's entries do not name one). It scans the stream a page at a
// time; a request with no entries gives a nil trail and a nil error.
func ReadStory(ctx context.Context, r Ranger, id string) (*Trail, error) {
	return ReadStoryAfter(ctx, r, id, "")
}

// ReadStoryAfter is ReadStory reading only the entries after the stream
// id afterID: a reader that knows roughly when the request was made (its
// creation time, less a margin) skips the older part of the stream.
// Entries of the request before afterID are missed.
func ReadStoryAfter(ctx context.Context, r Ranger, id, afterID string) (*Trail, error) {
	t := &Trail{}
	err := Scan(ctx, r, afterID, func(e approval.Entry) error {
		if e.RequestID == id {
			t.Add(e, true)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(t.Entries) == 0 {
		return nil, nil
	}
	if t.Requester == "" && t.RunID != "" {
		// The requester is the actor of the run's run_started entry, which
		// comes before the request's first entry: read up to there only.
		first := t.Entries[0].ID
		err := Scan(ctx, r, afterID, func(e approval.Entry) error {
			if e.ID == first {
				return errStopScan
			}
			if e.Event == approval.EventRunStarted && e.RunID == t.RunID {
				t.Requester = e.Actor
				return errStopScan
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStopScan) {
			return nil, err
		}
	}
	return t, nil
}
