package auditweb_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
)

// passkeyStory records: alice enrolls two passkeys (one vouched for by
// bob, one by single sign-on with a hostile email), confirms two votes
// with the first and revokes the second; carol's passkey, enrolled before
// the window, confirms one vote and is revoked by bob; a confirmation is
// refused for carol; dave's enrollment is refused with a hostile reason.
func passkeyStory(f *fakeAudit, now time.Time) {
	at := func(d time.Duration, r approval.Record) { f.Append(now.Add(-d), r) }
	at(200*24*time.Hour, approval.Record{Event: approval.EventPasskeyEnrolled, Actor: carol,
		Data: approval.PasskeyEvent{User: carol, Credential: "carolKEY0000000000000", VouchedBy: alice}})
	at(10*24*time.Hour, approval.Record{Event: approval.EventPasskeyEnrolled, Actor: alice,
		Data: approval.PasskeyEvent{User: alice, Credential: "aliceKEY1aaaaaaaaaaaa", VouchedBy: bob}})
	at(9*24*time.Hour, approval.Record{Event: approval.EventPasskeyEnrolled, Actor: alice,
		Data: approval.PasskeyEvent{User: alice, Credential: "aliceKEY2bbbbbbbbbbbb", Email: `alice@example.com<script>x</script>`}})
	verified := func(d time.Duration, who, req, cred string) {
		at(d, approval.Record{Event: approval.EventStepUpVerified, RequestID: req, Actor: who, Tool: "delete_customer",
			Data: approval.StepUpEvent{Verdict: approval.VerdictApprove, Methods: []approval.StepUpMethod{approval.StepUpPasskey}, Credential: cred}})
	}
	verified(8*24*time.Hour, alice, "req_del1", "aliceKEY1aaaaaaaaaaaa")
	verified(3*time.Hour, alice, "req_del2", "aliceKEY1aaaaaaaaaaaa")
	verified(5*24*time.Hour, carol, "req_del3", "carolKEY0000000000000")
	at(4*24*time.Hour, approval.Record{Event: approval.EventStepUpRefused, RequestID: "req_del4", Actor: carol,
		Data: approval.StepUpEvent{Verdict: approval.VerdictApprove, Reason: "passkey_not_verified"}})
	at(2*24*time.Hour, approval.Record{Event: approval.EventPasskeyRevoked, Actor: alice,
		Data: approval.PasskeyEvent{User: alice, Credential: "aliceKEY2bbbbbbbbbbbb"}})
	at(24*time.Hour, approval.Record{Event: approval.EventPasskeyRevoked, Actor: bob,
		Data: approval.PasskeyEvent{User: carol, Credential: "carolKEY0000000000000"}})
	at(time.Hour, approval.Record{Event: approval.EventPasskeyRefused, Actor: dave,
		Data: approval.PasskeyEvent{User: dave, Reason: `<img src=x onerror=alert(1)>`}})
	// Not a passkey entry: the page ignores it.
	at(time.Hour, approval.Record{Event: approval.EventDecided, RequestID: "req_other", Actor: bob, Tool: "refund",
		Data: approval.DecidedEvent{Verdict: approval.VerdictApprove}})
}

// TestPasskeysPage: one row per person, named, with their passkeys
// counted, when each was enrolled and who vouched, when last used, and
// the revoked ones marked; hostile text escaped; ?user= narrows the page
// to one person and lists their entries.
func TestPasskeysPage(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	f := &fakeAudit{}
	passkeyStory(f, now)
	h := newView(t, f, now, nil)

	code, body := get(t, h, "/audit/passkeys")
	if code != http.StatusOK {
		t.Fatalf("GET /audit/passkeys = %d\n%s", code, body)
	}
	want := []string{
		`<a href="/audit/passkeys" data-nav="passkeys">Passkeys</a>`,
		// alice: two enrolled, one revoked by herself, two confirmations.
		`<tr data-user="U0ALICE01"><td><a href="/audit/passkeys?since=90d&amp;user=U0ALICE01">alice</a> · <a href="/audit/history?approver=U0ALICE01" class="muted">decisions</a></td><td>1</td><td>1</td><td>2</td><td>0</td><td>2026-12-07 09:00:00 UTC</td>`,
		`<div class="passkey"><code>aliceKEY1aaa…</code> enrolled 2026-11-27 12:00:00 UTC, vouched for by bob · used 2×, last 2026-12-07 09:00:00 UTC</div>`,
		`<div class="passkey revoked"><code>aliceKEY2bbb…</code> enrolled 2026-11-28 12:00:00 UTC, single sign-on as alice@example.com&lt;script&gt;x&lt;/script&gt; · not used in the window · <span class="bad">revoked 2026-12-05 12:00:00 UTC by themselves</span></div>`,
		// carol: enrolled before the 90-day window, revoked by bob.
		`<tr data-user="U0CAROL01"><td><a href="/audit/passkeys?since=90d&amp;user=U0CAROL01">carol</a>`,
		`<td>0</td><td>1</td><td>1</td><td>1</td><td>2026-12-02 12:00:00 UTC</td>`,
		`<div class="passkey revoked"><code>carolKEY0000…</code> enrolled before the window · used 1×, last 2026-12-02 12:00:00 UTC · <span class="bad">revoked 2026-12-06 12:00:00 UTC by bob</span></div>`,
		// dave: no passkey, one refused enrollment.
		`<tr data-user="U0DAVE001"><td><a href="/audit/passkeys?since=90d&amp;user=U0DAVE001">dave</a>`,
		"revokes their passkeys themselves in Countersign's App Home",
	}
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Errorf("passkeys page lacks %q\n%s", w, body)
		}
	}
	if a, c, d := strings.Index(body, ">alice<"), strings.Index(body, ">carol<"), strings.Index(body, ">dave<"); !(a < c && c < d) {
		t.Errorf("people not ordered by name: alice at %d, carol at %d, dave at %d", a, c, d)
	}
	for _, bad := range []string{"<script>x", "U0BOB0001\"", "req_other"} {
		if strings.Contains(body, bad) {
			t.Errorf("passkeys page holds %q\n%s", bad, body)
		}
	}

	// A year's window reaches carol's enrollment and who vouched.
	_, body = get(t, h, "/audit/passkeys?since=365d")
	if w := `<code>carolKEY0000…</code> enrolled 2026-05-21 12:00:00 UTC, vouched for by alice`; !strings.Contains(body, w) {
		t.Errorf("365d page lacks %q\n%s", w, body)
	}

	_, body = get(t, h, "/audit/passkeys?user="+dave)
	for _, w := range []string{
		"<title>Passkeys of dave · Countersign audit</title>",
		`<td>enrollment refused</td><td>&lt;img src=x onerror=alert(1)&gt;</td>`,
	} {
		if !strings.Contains(body, w) {
			t.Errorf("dave's page lacks %q\n%s", w, body)
		}
	}
	if strings.Contains(body, "<img src=x") || strings.Contains(body, `data-user="U0ALICE01"`) {
		t.Errorf("dave's page holds raw markup or another person\n%s", body)
	}

	_, body = get(t, h, "/audit/passkeys?user="+carol)
	for _, w := range []string{
		`<td>confirmation refused</td><td>approve passkey_not_verified</td><td><a href="/audit/requests/req_del4">req_del4</a></td>`,
		`<td>vote confirmed</td><td>approve passkey carolKEY0000…</td>`,
		`<td>passkey revoked</td><td>passkey carolKEY0000…</td>`,
	} {
		if !strings.Contains(body, w) {
			t.Errorf("carol's page lacks %q\n%s", w, body)
		}
	}
	if r, v := strings.Index(body, "passkey revoked"), strings.Index(body, "vote confirmed"); r < 0 || v < 0 || r > v {
		t.Errorf("carol's entries not newest first: revoked at %d, confirmed at %d", r, v)
	}
}
