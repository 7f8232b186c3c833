package approval_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/countersign/countersign/approval"
)

// declaredTools are the tools of the look-alike tests: two pairs of
// declared tools close to each other (get_order and get_orders, one edit
// apart), as a policy may legitimately declare.
var declaredTools = []string{"issue_refund", "delete_customer", "get_order", "get_orders", "send_email", "lookup_order", "export_customer_data"}

// TestToolLookalikesRefused (issue 46, point 6): undeclared names within
// a small edit distance of a declared tool's skeleton are refused, naming
// the tool they pass for — the five ASCII look-alikes that passed the list
// of pairs under the external rule (cl for d, c for e, 7 for t, nn for m,
// v for u), and slips the list never held (a doubled, missing, swapped or
// extra letter) — through CheckToolName (what Propose asks first) and
// through the gate's external rule itself.
func TestToolLookalikesRefused(t *testing.T) {
	gate, err := approval.NewGate(policyOf(declaredTools))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, like string }{
		{"issue_refuncl", "issue_refund"},
		{"issue_rcfund", "issue_refund"},
		{"dele7e_customer", "delete_customer"},
		{"delete_custonner", "delete_customer"},
		{"delete_cvstomer", "delete_customer"},
		{"Issue_Refund", "issue_refund"},
		{"issue-refund", "issue_refund"},
		{"i55ue_refund", "issue_refund"},
		{"issue_refundd", "issue_refund"},               // a doubled letter
		{"isue_refund", "issue_refund"},                 // a missing one
		{"issue_rfeund", "issue_refund"},                // two swapped
		{"issue_refunds", "issue_refund"},               // one more
		{"delete_cusotmer_", "delete_customer"},         // swapped, and a separator
		{"dele7e_cust0mer", "delete_customer"},          // two look-alikes: the same skeleton
		{"exprot_customer_dat", "export_customer_data"}, // 16 characters and more: two edits
		{"send_emai1", "send_email"},
		{"get_ordr", "get_order"},
		{"set_order", "get_order"}, // another verb, one edit away: declare it to use it
		{"lookup_orders", "lookup_order"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := approval.CheckToolName(tc.name, declaredTools)
			if !errors.Is(err, approval.ErrConfusableTool) || !strings.Contains(err.Error(), `"`+tc.like+`"`) {
				t.Errorf("CheckToolName(%q) = %v, want ErrConfusableTool naming %q", tc.name, err, tc.like)
			}
			_, err = gate.AssessExternal(approval.ToolCall{Tool: tc.name, Args: []byte(`{}`)}, "U0ALICE")
			if !errors.Is(err, approval.ErrConfusableTool) {
				t.Errorf("AssessExternal(%q) = %v, want ErrConfusableTool: the external rule never judges a look-alike", tc.name, err)
			}
		})
	}
}

// TestToolNamesNotLookalikes: names that are not near a declared tool
// pass to the external rule, and a declared tool is never refused, however
// close to another declared one (get_order and get_orders).
func TestToolNamesNotLookalikes(t *testing.T) {
	gate, err := approval.NewGate(policyOf(declaredTools))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range append([]string{
		"issue_rebate", "refund_status", "create_customer", "update_customer", "list_customers",
		"get_invoice", "put_orders_on_hold", "send_sms", "read_email", "search", "get", "set", "ls",
		"delete_order", "issue_credit", "order_history", "lookup_user", "sendgrid_email",
	}, declaredTools...) {
		t.Run(name, func(t *testing.T) {
			if err := approval.CheckToolName(name, declaredTools); err != nil {
				t.Errorf("CheckToolName(%q) = %v, want nil", name, err)
			}
			if _, err := gate.AssessExternal(approval.ToolCall{Tool: name, Args: []byte(`{}`)}, "U0ALICE"); err != nil {
				t.Errorf("AssessExternal(%q) = %v, want assessed", name, err)
			}
		})
	}
}

// TestProposeLookalikeRefusedBeforeAnything: a look-alike through the
// lifecycle's door is refused before anything is judged, saved, audited
// or posted, whatever the external rule says.
func TestProposeLookalikeRefusedBeforeAnything(t *testing.T) {
	for _, name := range []string{"issue_refuncl", "issue_rcfund", "issue_refunb"} {
		t.Run(name, func(t *testing.T) {
			w := newProposeWorld(t)
			p := refund(60)
			p.Tool, p.External = name, true
			if _, err := w.life.Propose(context.Background(), p); !errors.Is(err, approval.ErrConfusableTool) {
				t.Fatalf("Propose(%q) = %v, want ErrConfusableTool", name, err)
			}
			if got := w.audit.got(); len(got) != 0 {
				t.Errorf("audit = %v, want nothing", got)
			}
		})
	}
}

// policyOf is a policy declaring tools, with a loose external rule (the
// rule a look-alike would borrow).
func policyOf(tools []string) approval.Policy {
	p := approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{},
		External: &approval.ToolPolicy{Risk: approval.RiskLow, Review: approval.ReviewNever}}
	for _, name := range tools {
		p.Tools[name] = approval.ToolPolicy{Risk: approval.RiskHigh, Review: approval.ReviewAlways}
	}
	return p
}

// FuzzConfusable: ToolSkeleton and Confusable never panic; a skeleton is
// its own skeleton; Confusable is symmetric, reflexive, and true for two
// names with one skeleton; and a long name costs what its length does (the
// distance only computes the band within its limit of the diagonal). The
// inputs are bounded to 1 KiB so a fuzzing run stays quick.
func FuzzConfusable(f *testing.F) {
	for _, seed := range [][2]string{
		{"issue_refund", "issue_refuncl"}, {"delete_customer", "dele7e_custonner"}, {"get_order", "get_orders"},
		{"rn", "m"}, {"", ""}, {"іssue_refund", "issue_refund"}, {"\xff\xfe", "a"}, {"ΑΒΕ", "abe"},
		{strings.Repeat("rn", 128), strings.Repeat("m", 127) + "n"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if len(a) > 1024 || len(b) > 1024 {
			t.Skip()
		}
		sa, sb := approval.ToolSkeleton(a), approval.ToolSkeleton(b)
		if again := approval.ToolSkeleton(sa); again != sa {
			t.Errorf("ToolSkeleton(ToolSkeleton(%q)) = %q, want %q", a, again, sa)
		}
		if !utf8.ValidString(sa) {
			t.Errorf("ToolSkeleton(%q) = %q, not valid UTF-8", a, sa)
		}
		ab, ba := approval.Confusable(a, b), approval.Confusable(b, a)
		if ab != ba {
			t.Errorf("Confusable(%q, %q) = %v but Confusable(%q, %q) = %v", a, b, ab, b, a, ba)
		}
		if sa == sb && !ab {
			t.Errorf("Confusable(%q, %q) = false with one skeleton %q", a, b, sa)
		}
		if !approval.Confusable(a, a) {
			t.Errorf("Confusable(%q, itself) = false", a)
		}
		if d := utf8.RuneCountInString(sa) - utf8.RuneCountInString(sb); ab && (d > 2 || d < -2) {
			t.Errorf("Confusable(%q, %q) = true with skeletons %d characters apart (at most 2 edits)", a, b, d)
		}
	})
}
