package policyfile_test

import (
	"maps"
	"testing"
)

// TestAPIKeyCallers: api.keys[].callers maps each identity a gateway
// asserts to the Slack user it is (bad entries: testdata/bad_api_callers.yaml).
func TestAPIKeyCallers(t *testing.T) {
	f := MustParse(t, `version: 1
slack:
  approvals_channel: G0APPROV1
tools:
  - name: lookup
    risk: low
    review: never
api:
  keys:
    - name: mesh
      sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
      tools: ["*"]
      callers:
        - identity: alice@example.com
          slack_user: U0ALICE01
        - identity: " 00u1carol "
          slack_user: U0CAROL01
    - name: plain
      sha256: 60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752
      tools: ["*"]
`)
	want := map[string]string{"alice@example.com": "U0ALICE01", "00u1carol": "U0CAROL01"}
	if got := f.API.Keys[0].Callers; !maps.Equal(got, want) {
		t.Errorf("mesh's Callers = %v, want %v", got, want)
	}
	if got := f.API.Keys[1].Callers; got != nil {
		t.Errorf("plain's Callers = %v, want none", got)
	}
}
