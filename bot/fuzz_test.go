package bot_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// Fuzz targets, one per HTTP ingress (events, interactive payloads, view
// submissions, slash commands). Each input is posted to the bot's real
// HTTP handler twice: with a wrong signature (must be 401) and correctly
// signed (must be 200, 400, 401 or 413). One bot, HTTP server, workspace
// and store serve every input of a fuzzing process (building and closing
// a bot per input ran 5-200 inputs a second); after each input the bot
// is drained (Bot.Drain: every job it queued has run, its card writer is
// idle) before the state is compared: a 401, 400 or 413 must leave no
// trace in Redis (keys under the prefix, the audit stream) and start no
// task. A panic anywhere (handler or queued work) fails the target.
//
// CI runs each for a bounded time (.ci/run); `go test` runs the seeds.

// fuzzNow is the bot's clock; bodies are signed at it.
var fuzzNow = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// fuzzFixture is what every iteration of a target shares.
type fuzzFixture struct {
	ws      *slacksim.Workspace
	api     *slack.Client
	rdb     redis.UniversalClient
	prefix  string
	store   *store.Store
	audit   *store.Audit
	runner  *fakeRunner
	request *approval.Request // pending, card bound: clicks on it can decide
	bot     *bot.Bot          // serves every input, drained after each
	srv     *httptest.Server  // the bot's HTTP handler
	// auditSeen is the last audit entry checkAudit looked at.
	auditSeen string
}

func newFuzzFixture(f *testing.F) *fuzzFixture {
	f.Helper()
	ws := slacksimtest.New(f, slacksim.Options{Now: func() time.Time { return fuzzNow }})
	for _, u := range []string{alice, bob, carol, mallory} {
		ws.AddUser(slacksim.User{ID: u, Name: u})
	}
	ws.AddChannel(slacksim.Channel{ID: tasks, Name: "tasks", Members: []string{alice, bob, mallory, slacksim.BotUserID}})
	ws.AddChannel(slacksim.Channel{ID: approvals, Name: "approvals", IsPrivate: true, Members: []string{alice, bob, carol, slacksim.BotUserID}})
	rdb, prefix := storetest.New(f)
	fx := &fuzzFixture{
		ws: ws, api: slacksimtest.Client(ws, "", ""), rdb: rdb, prefix: prefix, runner: &fakeRunner{},
		store: store.New(rdb, store.Options{Prefix: prefix, Now: func() time.Time { return fuzzNow }}),
		audit: store.NewAudit(rdb, store.AuditOptions{Stream: prefix + ":{audit}", Now: func() time.Time { return fuzzNow }}),
	}
	f.Cleanup(func() { _ = fx.store.Close() })
	r := &approval.Request{
		ID: "req_aaaaaaaaaaaaaaaaaaaaaaaaaa", RunID: approval.NewID("run"), Requester: alice,
		Origin: approval.Origin{Channel: tasks, ThreadTS: "1700000000.000100"},
		Tool:   "issue_refund", Risk: approval.RiskHigh,
		Args:      json.RawMessage(`{"order_id":"1234","amount":64}`),
		Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject, approval.VerdictRespond},
		Approvers: approval.Approvers{ChannelMembers: true}, Quorum: 1, Created: fuzzNow, Deadline: fuzzNow.Add(time.Hour),
	}
	ctx := context.Background()
	if err := fx.store.CreateRequest(ctx, r); err != nil {
		f.Fatalf("CreateRequest: %v", err)
	}
	if _, err := fx.store.BindCard(ctx, r.ID, approval.CardRef{Channel: approvals, TS: "1700000000.000200"}); err != nil {
		f.Fatalf("BindCard: %v", err)
	}
	fx.request = r

	pf := testPolicy()
	life, err := approval.NewLifecycle(approval.LifecycleOptions{Records: store.NewLedger(fx.store, fx.audit), Now: func() time.Time { return fuzzNow },
		Gate: mustGate(f, pf), Schemas: pf})
	if err != nil {
		f.Fatal(err)
	}
	fx.bot, err = bot.New(bot.Options{
		Slack: fx.api, Requests: fx.store, Lifecycle: life, Runner: fx.runner, Policy: pf,
		Now: func() time.Time { return fuzzNow }, Sleep: func(ctx context.Context, _ time.Duration) error { return ctx.Err() },
		Workers: 2, SigningSecret: secret,
	})
	if err != nil {
		f.Fatal(err)
	}
	life.SetCards(fx.bot)
	life.SetDirectory(fx.bot)
	if err := fx.bot.Start(ctx); err != nil {
		f.Fatalf("Start: %v", err)
	}
	f.Cleanup(func() { _ = fx.bot.Close() })
	fx.srv = httptest.NewServer(fx.bot.HTTPHandler())
	f.Cleanup(fx.srv.Close)
	return fx
}

// fuzzState is what an input may change: keys under the prefix (with
// their sizes: the audit stream's length, a record's field count) and
// the tasks handed to the runner.
type fuzzState struct {
	keys  map[string]int64
	tasks int
}

// stateScript returns every key under the prefix ARGV[1] with its size
// (a stream's length, a hash's field count, …), flattened: one round trip
// per node instead of three per key, so a fuzz input costs about as much
// as the bot's own work. KEYS inside a script reads undeclared keys: fine
// for a test's own prefix on a single node (on a Cluster it runs on each
// master, over that master's keys only).
var stateScript = redis.NewScript(`
local out = {}
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
  local t = redis.call('TYPE', k)['ok']
  local n = 0
  if t == 'stream' then n = redis.call('XLEN', k)
  elseif t == 'hash' then n = redis.call('HLEN', k)
  elseif t == 'zset' then n = redis.call('ZCARD', k)
  elseif t == 'list' then n = redis.call('LLEN', k)
  end
  out[#out + 1] = k
  out[#out + 1] = n
end
return out
`)

func (fx *fuzzFixture) state(t *testing.T) fuzzState {
	t.Helper()
	ctx := context.Background()
	st := fuzzState{keys: map[string]int64{}, tasks: len(fx.runner.Tasks())}
	var mu sync.Mutex // guards st.keys
	sizesOf := func(ctx context.Context, c redis.Scripter) error {
		v, err := stateScript.Run(ctx, c, nil, fx.prefix+"*").Slice()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for i := 0; i+1 < len(v); i += 2 {
			k, _ := v[i].(string)
			n, _ := v[i+1].(int64)
			st.keys[k] = n
		}
		return nil
	}
	var err error
	if cc, ok := fx.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return sizesOf(ctx, c) })
	} else {
		err = sizesOf(ctx, fx.rdb)
	}
	if err != nil {
		t.Fatalf("key sizes: %v", err)
	}
	return st
}

func (s fuzzState) equal(o fuzzState) bool {
	if s.tasks != o.tasks || len(s.keys) != len(o.keys) {
		return false
	}
	for k, n := range s.keys {
		if m, ok := o.keys[k]; !ok || m != n {
			return false
		}
	}
	return true
}

// check posts body to path on the fixture's bot, unsigned then signed,
// and asserts the answers and that refused bodies change nothing.
func (fx *fuzzFixture) check(t *testing.T, path, contentType string, body []byte) {
	srv := fx.srv
	before := fx.state(t)
	post := func(sign string) int {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		ts := fuzzNow.Unix()
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("X-Slack-Request-Timestamp", strconv.FormatInt(ts, 10))
		req.Header.Set("X-Slack-Signature", slacksim.Sign(sign, ts, body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v (a handler panic closes the connection)", path, err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if got := post("not-" + secret); got != http.StatusUnauthorized {
		t.Errorf("POST %s with a wrong signature = %d, want 401", path, got)
	}
	got := post(secret)
	if !slices.Contains([]int{http.StatusOK, http.StatusBadRequest, http.StatusUnauthorized, http.StatusRequestEntityTooLarge}, got) {
		t.Errorf("POST %s signed = %d, want 200, 400, 401 or 413", path, got)
	}
	if err := fx.bot.Drain(context.Background()); err != nil { // every queued job done
		t.Fatalf("Drain: %v", err)
	}
	if got != http.StatusOK {
		if after := fx.state(t); !before.equal(after) {
			t.Errorf("POST %s answered %d but changed state: %v → %v", path, got, before, after)
		}
	}
	fx.checkDecisions(t)
	fx.checkAudit(t)
}

// checkDecisions: only the request's approvers (bob and carol: the
// approvals channel's members but the requester and the bot) decide it.
func (fx *fuzzFixture) checkDecisions(t *testing.T) {
	t.Helper()
	r, err := fx.store.Request(context.Background(), fx.request.ID)
	if err != nil {
		t.Fatalf("Request: %v", err)
	}
	var deciders []string
	for _, a := range r.Approvals {
		deciders = append(deciders, a.Approver)
	}
	if r.Decision != nil {
		deciders = append(deciders, r.Decision.Approver)
	}
	for _, who := range deciders {
		if who != bob && who != carol {
			t.Fatalf("request decided by %q, who is not an approver", clip.Bytes(who, 64))
		}
	}
}

// checkAudit: every entry written since the last check keeps its ids
// small, whatever the payload carried.
func (fx *fuzzFixture) checkAudit(t *testing.T) {
	t.Helper()
	entries, err := fx.audit.Range(context.Background(), fx.auditSeen, 10000)
	if err != nil {
		t.Fatalf("audit Range: %v", err)
	}
	for _, e := range entries {
		fx.auditSeen = e.ID
		if n := max(len(e.RequestID), len(e.Actor), len(e.Tool), len(e.RunID)); n > 2*approval.MaxField {
			t.Errorf("audit %s entry has a %d-byte id, want it clipped", e.Event, n)
		}
	}
}

func form(field string, payload []byte) []byte {
	return []byte(url.Values{field: {string(payload)}}.Encode())
}

// FuzzEvents fuzzes POST /slack/events bodies.
func FuzzEvents(f *testing.F) {
	fx := newFuzzFixture(f)
	for _, seed := range []string{
		`{"type":"url_verification","token":"x","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}`,
		`{"token":"x","team_id":"T0SIM0001","api_app_id":"A0SIM0001","event":{"type":"app_mention","user":"U0ALICE01","text":"<@U0SIMBOT1> refund order 1234","ts":"1700000000.000300","channel":"C0TASKS01","event_ts":"1700000000.000300"},"type":"event_callback","event_id":"Ev0FUZZ0001","event_time":1700000000}`,
		`{"token":"x","team_id":"T0SIM0001","event":{"type":"message","channel_type":"im","user":"U0ALICE01","text":"hello","ts":"1700000000.000400","channel":"D0ALICE01"},"type":"event_callback","event_id":"Ev0FUZZ0002"}`,
		`{"token":"x","team_id":"T0SIM0001","event":{"type":"app_home_opened","user":"U0BOB0001","channel":"D0BOB0001","tab":"home"},"type":"event_callback","event_id":"Ev0FUZZ0003"}`,
		`{"token":"x","team_id":"T0SIM0001","event":{"type":"message","subtype":"bot_message","bot_id":"B0SIMBOT1","text":"hi","ts":"1.2","channel":"C0TASKS01"},"type":"event_callback","event_id":"Ev0FUZZ0004"}`,
		`{"type":"event_callback","event":{"type":"app_mention","user":"U0ALICE01","text":"no channel"}}`,
		`{"type":"event_callback","team_id":"T0OTHER01","event_id":"Ev0FUZZ0005","event":{"type":"app_mention","user":"U0EVE0001","user_team":"T0OTHER01","text":"hi","ts":"1.3","channel":"C0TASKS01"}}`,
		`{`, `null`, `[]`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fx.check(t, "/slack/events", "application/json", body)
	})
}

// clickSeed is a block_actions payload as Slack sends it for a card button.
func clickSeed(user, action, value string) string {
	return `{"type":"block_actions","user":{"id":"` + user + `","username":"u","name":"u","team_id":"T0SIM0001"},"api_app_id":"A0SIM0001","token":"x",` +
		`"container":{"type":"message","message_ts":"1700000000.000200","channel_id":"G0APPROV1","is_ephemeral":false},"trigger_id":"1.2.abc",` +
		`"team":{"id":"T0SIM0001","domain":"sim"},"channel":{"id":"G0APPROV1","name":"approvals"},"message":{"ts":"1700000000.000200","type":"message"},` +
		`"response_url":"http://127.0.0.1:1/response","actions":[{"action_id":"` + action + `","block_id":"cs_actions","text":{"type":"plain_text","text":"Approve"},"value":"` + value + `","type":"button","action_ts":"1700000001.0"}]}`
}

// FuzzInteractive fuzzes the payload of POST /slack/interactive (button
// clicks, and whatever else the fuzzer makes of them).
func FuzzInteractive(f *testing.F) {
	fx := newFuzzFixture(f)
	ref := fx.request.ID + "|" + fx.request.Digest + "|G0APPROV1|1700000000.000200"
	for _, seed := range []string{
		clickSeed(slacksim.BotUserID, "cs_approve", ref),
		clickSeed(mallory, "cs_approve", ref),
		clickSeed(alice, "cs_approve", ref),
		clickSeed(bob, "cs_approve", "req_zzzzzzzzzzzzzzzzzzzzzzzzzz|digest"),
		clickSeed(bob, "cs_approve", "garbage"),
		clickSeed("U0"+strings.Repeat("X", 4096), "cs_approve", ref),
		clickSeed(bob, "cs_approve", "req_"+strings.Repeat("x", 4096)+"|digest"),
		clickSeed(bob, "cs_reject", ref),
		clickSeed(bob, "cs_revoke_grant", fx.request.ID+"|grant_x"),
		`{"type":"block_actions","team":{"id":"T0OTHER01"},"user":{"id":"U0EVE0001","team_id":"T0OTHER01"},"actions":[{"action_id":"cs_approve","value":"` + ref + `"}]}`,
		`{"type":"view_closed","team":{"id":"T0SIM0001"},"user":{"id":"U0BOB0001"},"view":{"id":"V1"}}`,
		`{"type":"block_actions","actions":[]}`,
		`{`, `null`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		fx.check(t, "/slack/interactive", "application/x-www-form-urlencoded", form("payload", payload))
	})
}

// viewSeed is a view_submission payload as Slack sends it for a modal.
func viewSeed(user, callback, meta, values string) string {
	return `{"type":"view_submission","team":{"id":"T0SIM0001","domain":"sim"},"user":{"id":"` + user + `","username":"u","team_id":"T0SIM0001"},` +
		`"api_app_id":"A0SIM0001","token":"x","trigger_id":"1.2.def","view":{"id":"V0FUZZ001","team_id":"T0SIM0001","type":"modal",` +
		`"callback_id":"` + callback + `","private_metadata":"` + meta + `","hash":"1.abc","state":{"values":` + values + `}}}`
}

// FuzzViewSubmission fuzzes view_submission payloads (Reject, Respond and
// Edit modals).
func FuzzViewSubmission(f *testing.F) {
	fx := newFuzzFixture(f)
	meta := fx.request.ID + "|" + fx.request.Digest + "|G0APPROV1|1700000000.000200|http://127.0.0.1:1/response"
	for _, seed := range []string{
		viewSeed(bob, "cs_reject", meta, `{"reason":{"text":{"type":"plain_text_input","value":"too much"}}}`),
		viewSeed(mallory, "cs_reject", meta, `{"reason":{"text":{"type":"plain_text_input","value":"no"}}}`),
		viewSeed(bob, "cs_respond", meta, `{"response":{"text":{"type":"plain_text_input","value":"answer"}}}`),
		viewSeed(bob, "cs_reject", meta, `{"reason":{"text":{"type":"plain_text_input","value":" "}}}`),
		viewSeed(bob, "cs_edit", meta, `{"f1":{"v":{"type":"plain_text_input","value":"1234"}},"f2":{"v":{"type":"number_input","value":"50"}}}`),
		viewSeed(bob, "cs_edit", meta, `{"args_json":{"v":{"type":"plain_text_input","value":"{\"order_id\":\"1\",\"amount\":9999}"}}}`),
		viewSeed(bob, "cs_edit", "req_zzzzzzzzzzzzzzzzzzzzzzzzzz|d|G0APPROV1|1.2", `{}`),
		viewSeed(bob, "cs_reject", "garbage", `{}`),
		`{"type":"view_submission","view":{"callback_id":"cs_edit","private_metadata":"|"}}`,
		`{`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		fx.check(t, "/slack/interactive", "application/x-www-form-urlencoded", form("payload", payload))
	})
}

// FuzzSlashCommands fuzzes POST /slack/commands form bodies.
func FuzzSlashCommands(f *testing.F) {
	fx := newFuzzFixture(f)
	for _, seed := range []string{
		"token=x&team_id=T0SIM0001&team_domain=sim&channel_id=C0TASKS01&channel_name=tasks&user_id=U0BOB0001&user_name=bob&command=%2Fcountersign&text=pending&api_app_id=A0SIM0001&is_enterprise_install=false&response_url=http%3A%2F%2F127.0.0.1%3A1%2Fr&trigger_id=1.2.ghi",
		"token=x&team_id=T0SIM0001&channel_id=C0TASKS01&user_id=U0ALICE01&command=%2Fcountersign&text=",
		"token=x&team_id=T0SIM0001&channel_id=C0TASKS01&user_id=U0ALICE01&command=%2Fcountersign&text=help+me",
		"team_id=T0OTHER01&user_id=U0EVE0001&user_team_id=T0OTHER01&command=%2Fcountersign&text=pending",
		"%zz", "", "user_id=" + string(bytes.Repeat([]byte("A"), 100)),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fx.check(t, "/slack/commands", "application/x-www-form-urlencoded", body)
	})
}
