package auditweb

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
)

// passkeysPage is who can confirm a vote with a passkey, drawn from the
// audit stream alone (passkey_* and step_up_* entries of a window): the
// view stays read-only and needs no access to the store's passkeys.
type passkeysPage struct {
	Since, Until time.Time
	Window       string
	Windows      []string
	Problem      string
	Cut          bool
	Entries      int
	// User is the person the page is narrowed to (?user=, a Slack user
	// id), "" for everyone; UserName is how they are shown.
	User, UserName string
	People         []passkeyPerson
	// Log is the person's passkey and step-up entries, newest first; only
	// when the page is narrowed to one.
	Log    []passkeyLogRow
	Prefix string
}

func (p passkeysPage) title() string {
	if p.User != "" {
		return "Passkeys of " + p.UserName
	}
	return "Passkeys"
}

// passkeyPerson is one person's passkeys and confirmations.
type passkeyPerson struct {
	ID, Name string
	// Link narrows the page to them; History lists their decisions.
	Link, History string
	Active        int
	Revoked       int
	Confirmations int
	Refusals      int
	LastUsed      time.Time
	Keys          []passkeyKey
}

// passkeyKey is one credential as the window tells it. A zero Enrolled
// means it was enrolled before the window.
type passkeyKey struct {
	ID        string // the credential id, shortened
	full      string
	Enrolled  time.Time
	Vouch     string // who vouched, or the identity provider's email, in words
	vouchedBy string // the Slack user id of who vouched, named when the page is drawn
	Uses      int
	LastUsed  time.Time
	Revoked   time.Time
	RevokedBy string
}

// passkeyLogRow is one of a person's entries.
type passkeyLogRow struct {
	At        time.Time
	What      string
	Detail    string
	RequestID string
}

// passkeyEvents are the entries the page reads.
var passkeyEvents = map[approval.Event]string{
	approval.EventPasskeyOffered:  "enrollment link given",
	approval.EventPasskeyEnrolled: "passkey enrolled",
	approval.EventPasskeyRefused:  "enrollment refused",
	approval.EventPasskeyRevoked:  "passkey revoked",
	approval.EventStepUpOffered:   "confirmation asked",
	approval.EventStepUpVerified:  "vote confirmed",
	approval.EventStepUpRefused:   "confirmation refused",
}

// shortCredential shows a credential id (base64url, often 40+ characters)
// by its start: enough to tell a person's passkeys apart.
func shortCredential(id string) string {
	id = auditreport.Clean(id, 200)
	if len(id) > 12 {
		return id[:12] + "…"
	}
	return cmp.Or(id, "—")
}

func (h *Handler) servePasskeys(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := h.opts.Now()
	q := r.URL.Query()
	page := passkeysPage{Window: "90d", Windows: []string{"30d", "90d", "365d"}, Prefix: h.opts.Prefix,
		User: strings.TrimSpace(q.Get("user"))}
	if s := strings.TrimSpace(q.Get("since")); s != "" {
		page.Window = s
	}
	d, err := auditreport.ParseSince(page.Window)
	if err != nil {
		page.Problem = "since: " + err.Error() + "; showing 90d"
		page.Window, d = "90d", 90*24*time.Hour
	}
	page.Since, page.Until = now.Add(-d), now
	if page.User != "" {
		page.UserName = h.name(ctx, page.User)
	}
	b := passkeyBuilder{people: map[string]*passkeyPerson{}}
	if page.Cut, err = h.scanWindow(ctx, page.Since, func(e approval.Entry) {
		page.Entries++
		b.add(e, page.User, &page.Log)
	}); err != nil {
		h.fail(w, r, "audit stream", err)
		return
	}
	slices.Reverse(page.Log)
	page.People = h.passkeyPeople(ctx, page.Window, page.User, b.people)
	h.render(w, r, "passkeys", page)
}

// passkeyBuilder gathers the people of the window's entries, by Slack
// user id.
type passkeyBuilder struct {
	people map[string]*passkeyPerson
}

func (b *passkeyBuilder) person(id string) *passkeyPerson {
	p := b.people[id]
	if p == nil {
		p = &passkeyPerson{ID: id}
		b.people[id] = p
	}
	return p
}

// key returns the person's credential id, added (enrolled before the
// window) when the window has not shown it yet.
func (p *passkeyPerson) key(id string) *passkeyKey {
	for i := range p.Keys {
		if p.Keys[i].full == id {
			return &p.Keys[i]
		}
	}
	p.Keys = append(p.Keys, passkeyKey{ID: shortCredential(id), full: id})
	return &p.Keys[len(p.Keys)-1]
}

// add folds e into the people; when e is one of user's entries it is
// also appended to log.
func (b *passkeyBuilder) add(e approval.Entry, user string, log *[]passkeyLogRow) {
	what, ok := passkeyEvents[e.Event]
	if !ok {
		return
	}
	row := passkeyLogRow{At: e.Time, What: what, RequestID: e.RequestID}
	who := e.Actor
	switch e.Event {
	case approval.EventPasskeyOffered, approval.EventPasskeyEnrolled, approval.EventPasskeyRefused, approval.EventPasskeyRevoked:
		var pe approval.PasskeyEvent
		_ = json.Unmarshal(e.Data, &pe) // a malformed entry counts as one without data
		who = cmp.Or(pe.User, e.Actor)
		if who == "" {
			return
		}
		p := b.person(who)
		switch e.Event {
		case approval.EventPasskeyEnrolled:
			if pe.Credential == "" {
				break
			}
			k := p.key(pe.Credential)
			k.Enrolled = e.Time
			switch {
			case pe.VouchedBy != "":
				k.vouchedBy = pe.VouchedBy
			case pe.Email != "":
				k.Vouch = "single sign-on as " + auditreport.Clean(pe.Email, 100)
			}
		case approval.EventPasskeyRevoked:
			if pe.Credential != "" {
				k := p.key(pe.Credential)
				k.Revoked, k.RevokedBy = e.Time, e.Actor
			}
		case approval.EventPasskeyRefused:
			p.Refusals++
		}
		row.Detail = strings.TrimSpace(shortIf(pe.Credential) + " " + auditreport.Clean(pe.Reason, 100))
	default:
		var se approval.StepUpEvent
		_ = json.Unmarshal(e.Data, &se)
		if who == "" {
			return // a link nobody could be tied to (used or expired)
		}
		p := b.person(who)
		switch e.Event {
		case approval.EventStepUpVerified:
			p.Confirmations++
			p.LastUsed = e.Time
			if se.Credential != "" {
				k := p.key(se.Credential)
				k.Uses++
				k.LastUsed = e.Time
			}
		case approval.EventStepUpRefused:
			p.Refusals++
		}
		var methods []string
		for _, m := range se.Methods {
			methods = append(methods, string(m))
		}
		row.Detail = strings.TrimSpace(strings.Join([]string{string(se.Verdict), strings.Join(methods, ", "),
			credentialIf(se.Credential), se.Reason}, " "))
		row.Detail = auditreport.Clean(strings.Join(strings.Fields(row.Detail), " "), 200)
	}
	if user != "" && who == user {
		*log = append(*log, row)
	}
}

// shortIf names a credential in an entry's detail, "" for none.
func shortIf(id string) string {
	if id == "" {
		return ""
	}
	return "passkey " + shortCredential(id)
}

// credentialIf is shortCredential, or "" for no credential.
func credentialIf(id string) string {
	if id == "" {
		return ""
	}
	return shortCredential(id)
}

// passkeyPeople names the people (only user, when set), counts their passkeys and orders them
// by name.
func (h *Handler) passkeyPeople(ctx context.Context, window, user string, people map[string]*passkeyPerson) []passkeyPerson {
	out := make([]passkeyPerson, 0, len(people))
	for _, p := range people {
		if user != "" && p.ID != user {
			continue
		}
		p.Name = h.name(ctx, p.ID)
		p.Link = h.opts.Prefix + "passkeys?" + url.Values{"user": {p.ID}, "since": {window}}.Encode()
		p.History = h.opts.Prefix + "history?" + url.Values{"approver": {p.ID}}.Encode()
		for i := range p.Keys {
			k := &p.Keys[i]
			if k.vouchedBy != "" {
				k.Vouch = "vouched for by " + h.name(ctx, k.vouchedBy)
			}
			if k.Revoked.IsZero() {
				p.Active++
			} else {
				p.Revoked++
				if k.RevokedBy == p.ID {
					k.RevokedBy = "themselves"
				} else {
					k.RevokedBy = h.name(ctx, k.RevokedBy)
				}
			}
		}
		slices.SortStableFunc(p.Keys, func(a, b passkeyKey) int { return a.Enrolled.Compare(b.Enrolled) })
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b passkeyPerson) int {
		return cmp.Or(strings.Compare(strings.ToLower(a.Name), strings.ToLower(b.Name)), strings.Compare(a.ID, b.ID))
	})
	return out
}
