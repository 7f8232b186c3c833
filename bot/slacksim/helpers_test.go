package slacksim_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
)

// TestMain stops the browser that the browser tests share
// (slacksimtest.Browser) after the last test.
func TestMain(m *testing.M) { os.Exit(slacksimtest.Main(m)) }

// Seeded identities shared by the tests.
const (
	alice     = "U0ALICE01"
	bob       = "U0BOB0001"
	carol     = "U0CAROL01"
	tasks     = "C0TASKS01"
	approvals = "G0APPROV1"
	random    = "C0RANDOM1"
	approvers = "S0APPROV1"
)

// mustWorkspace serves a seeded workspace on an httptest server and
// returns it with a real slack-go client pointed at it. Unless opts says
// otherwise, the app has the scopes and events of the checkout's
// manifest.yml.
func mustWorkspace(tb testing.TB, opts slacksim.Options) (*slacksim.Workspace, *slack.Client) {
	tb.Helper()
	if opts.Manifest == nil {
		opts.Manifest = slacksimtest.Manifest(tb)
	}
	ws := slacksim.New(opts)
	srv := httptest.NewServer(ws.Handler())
	ws.SetBaseURL(srv.URL)
	tb.Cleanup(func() {
		ws.Close()
		srv.Close()
	})
	seed(tb, ws)
	api := slack.New("xoxb-sim",
		slack.OptionAPIURL(ws.APIURL()),
		slack.OptionAppLevelToken("xapp-sim"),
	)
	return ws, api
}

func seed(tb testing.TB, ws *slacksim.Workspace) {
	tb.Helper()
	ws.AddUser(slacksim.User{ID: alice, Name: "alice", RealName: "Alice Archer"})
	ws.AddUser(slacksim.User{ID: bob, Name: "bob", RealName: "Bob Baker"})
	ws.AddUser(slacksim.User{ID: carol, Name: "carol", RealName: "Carol Cole"})
	ws.AddChannel(slacksim.Channel{ID: tasks, Name: "tasks", Members: []string{alice, bob, slacksim.BotUserID}})
	ws.AddChannel(slacksim.Channel{ID: approvals, Name: "approvals", IsPrivate: true, Members: []string{bob, carol, slacksim.BotUserID}})
	ws.AddChannel(slacksim.Channel{ID: random, Name: "random", Members: []string{alice}})
	ws.AddUsergroup(slacksim.Usergroup{ID: approvers, Handle: "approvers", Name: "Approvers", Users: []string{bob, carol}})
}

// waitFor fails the test if cond does not hold within 5 seconds.
func waitFor(tb testing.TB, ws *slacksim.Workspace, what string, cond func() bool) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ws.WaitFor(ctx, cond); err != nil {
		tb.Fatalf("waiting for %s: %v", what, err)
	}
}

// delivered is one HTTP delivery received by httpApp.
type delivered struct {
	Path   string
	Header http.Header
	Body   []byte
}

// httpApp is a fake app endpoint for HTTP delivery. Every request is sent
// on got; answer decides the reply (default 200 with an empty body).
type httpApp struct {
	srv    *httptest.Server
	got    chan delivered
	mu     sync.Mutex // guards answer
	answer func(d delivered) (int, string)
}

func newHTTPApp(tb testing.TB) *httpApp {
	tb.Helper()
	a := &httpApp{got: make(chan delivered, 64)}
	a.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		d := delivered{Path: r.URL.Path, Header: r.Header.Clone(), Body: body}
		a.got <- d
		a.mu.Lock()
		answer := a.answer
		a.mu.Unlock()
		status, reply := http.StatusOK, ""
		if answer != nil {
			status, reply = answer(d)
		}
		if reply != "" {
			rw.Header().Set("Content-Type", "application/json")
		}
		rw.WriteHeader(status)
		_, _ = io.WriteString(rw, reply)
	}))
	tb.Cleanup(a.srv.Close)
	return a
}

func (a *httpApp) setAnswer(f func(d delivered) (int, string)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.answer = f
}

func (a *httpApp) options(secret string) slacksim.Options {
	return slacksim.Options{
		Delivery:       slacksim.HTTP,
		EventsURL:      a.srv.URL + "/events",
		InteractiveURL: a.srv.URL + "/interactive",
		CommandsURL:    a.srv.URL + "/commands",
		SigningSecret:  secret,
	}
}

// next returns the next delivery or fails after 5 seconds.
func (a *httpApp) next(tb testing.TB) delivered {
	tb.Helper()
	select {
	case d := <-a.got:
		return d
	case <-time.After(5 * time.Second):
		tb.Fatal("no HTTP delivery within 5s")
		return delivered{}
	}
}
