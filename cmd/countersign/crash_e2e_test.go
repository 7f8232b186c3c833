package main_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
)

// holdFirstCard serves ws and, on the first chat.postMessage of an approval
// card, lets the workspace post it and then never answers the caller: the
// card exists in Slack, the process that posted it never learns its ts. It
// returns a channel closed once that card is in the workspace.
func holdFirstCard(t *testing.T, ws *slacksim.Workspace) <-chan struct{} {
	t.Helper()
	posted := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	inner := ws.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/chat.postMessage" {
			inner.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		held := false
		if bytes.Contains(body, []byte("cs_approve")) {
			once.Do(func() { held = true })
		}
		if !held {
			inner.ServeHTTP(w, r)
			return
		}
		inner.ServeHTTP(httptest.NewRecorder(), r) // posted; the answer is dropped
		close(posted)
		<-release // until the test ends: the caller is killed meanwhile
	}))
	ws.SetBaseURL(srv.URL)
	// Cleanups run last-in first-out: release the held request, close the
	// workspace's sockets, then the server (which waits for its handlers).
	t.Cleanup(srv.Close)
	t.Cleanup(ws.Close)
	t.Cleanup(func() { close(release) })
	return posted
}

// TestSIGKILLBetweenPostAndBind kills the real binary in the instant after
// Slack posted a request's card and before the process learned where it is
// (so before it could bind it). A second process adopts the run: it finds
// the card Slack already has and binds it (no second card); an approval
// there runs the refund once, and the same card ends showing what ran.
func TestSIGKILLBetweenPostAndBind(t *testing.T) {
	t.Parallel()
	// The app has manifest.yml's scopes: finding the card on the private
	// approvals channel needs groups:history.
	ws := slacksim.New(slacksim.Options{Manifest: slacksimtest.Manifest(t)})
	posted := holdFirstCard(t, ws)
	rig := newServeRig(t, ws)
	ctx := context.Background()
	cast, sor, st := rig.cast, rig.sor, rig.st

	first := startServe(t, rig.bin, rig.env)
	wsWait := func(p *serveProcess, what string, cond func() bool) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := ws.WaitFor(wctx, cond); err != nil {
			t.Fatalf("waiting for %s: %v\nlogs:\n%s", what, err, p.stderr.String())
		}
	}
	wsWait(first, "the first process's socket", func() bool { return ws.Connections() > 0 })
	root, err := ws.PostMessage(cast.Requester.ID, cast.Tasks.ID,
		"<@"+slacksim.BotUserID+"> order 1234 arrived damaged — look it up and refund the shipping", "")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-posted:
	case <-time.After(30 * time.Second):
		t.Fatalf("no card posted\nlogs:\n%s", first.stderr.String())
	}
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatalf("SIGKILL: %v", err)
	}
	<-first.done
	// The workspace drops the dead socket when it reads its end; until
	// then it may hand the click below to it, and the click is lost.
	wsWait(first, "the killed process's socket gone", func() bool { return ws.Connections() == 0 })

	cards := func() []slacksim.Message {
		var out []slacksim.Message
		for _, m := range ws.Messages(cast.Approvals.ID) {
			if m.ThreadTS == "" && strings.Contains(string(m.Blocks), "issue_refund") {
				out = append(out, m)
			}
		}
		return out
	}
	if n := len(cards()); n != 1 {
		t.Fatalf("refund cards after the kill = %d, want the 1 posted", n)
	}
	card := cards()[0]
	pending, err := st.Pending(ctx)
	if err != nil || len(pending) != 1 {
		t.Fatalf("Pending = %v, %v; want the refund's request", pending, err)
	}
	req := pending[0]
	if req.Card.Bound() {
		t.Fatalf("request bound to %+v although its poster died before binding", req.Card)
	}

	// The second process adopts the run and binds the card Slack has.
	second := startServe(t, rig.bin, rig.env)
	waitUntil(t, "the card bound by the second process", func() bool {
		r, err := st.Request(ctx, req.ID)
		return err == nil && r.Card.Bound()
	})
	bound, err := st.Request(ctx, req.ID)
	if err != nil {
		t.Fatal(err)
	}
	if bound.Card.TS != card.TS || bound.Card.Channel != card.Channel {
		t.Fatalf("bound to %+v, want the card already posted (%s %s)", bound.Card, card.Channel, card.TS)
	}
	wsWait(second, "the second process's socket", func() bool { return ws.Connections() > 0 })
	if err := ws.Click(cast.Approver.ID, cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click(approve): %v", err)
	}
	wsWait(second, "the card showing the refund ran", func() bool {
		m, ok := ws.Message(cast.Approvals.ID, card.TS)
		return ok && !strings.Contains(string(m.Blocks), "cs_approve") && strings.Contains(string(m.Blocks), "Ran")
	})
	wsWait(second, "the run's answer in the task thread", func() bool {
		for _, m := range ws.Replies(cast.Tasks.ID, root) {
			if m.BotID != "" && strings.Contains(strings.ToLower(m.Text), "refund") && len(sor.Refunds()) == 1 {
				return true
			}
		}
		return false
	})
	second.stop(t)

	if rf := sor.Refunds(); len(rf) != 1 {
		t.Errorf("refunds = %+v, want exactly one", rf)
	}
	if n := len(cards()); n != 1 {
		t.Errorf("refund cards = %d, want the one card (never a second post)", n)
	}
	if r, err := st.Request(ctx, req.ID); err != nil || r.Status != approval.StatusExecuted {
		t.Errorf("request = %+v, %v; want executed", r, err)
	}
	if _, err := rig.audit.Verify(ctx); err != nil {
		t.Errorf("audit Verify: %v", err)
	}
}
