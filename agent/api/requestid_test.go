package api_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/approval"
)

// TestRequestIDIsTheHMAC: a request's id is the HMAC-SHA256 of its call's
// name space, key and call id under the deployment's secret, as ids were
// always made (a retry after an upgrade finds the request it made before),
// also while many are made at once (the HMACs are reused).
func TestRequestIDIsTheHMAC(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	secret, err := h.store.Secret(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := func(space, keyHash, callID string) string {
		mac := hmac.New(sha256.New, secret)
		mac.Write([]byte(space + "\x00" + keyHash + "\x00" + callID))
		return "req_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(mac.Sum(nil)[:16]))
	}
	cases := []struct {
		caller string
		kind   approval.Kind
		space  string
	}{
		{approval.CallerAPI, approval.KindCall, "countersign-api"},
		{approval.CallerAPI, approval.KindContact, "countersign-api-" + string(approval.KindContact)},
		{approval.CallerHumanLayer, approval.KindCall, "countersign-humanlayer-" + string(approval.KindCall)},
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				c := cases[i%len(cases)]
				key, call := api.HashKey(fmt.Sprint("key-", g)), fmt.Sprint("call-", i, "-\x00é")
				if got, w := api.RequestID(h.server, c.caller, c.kind, key, call), want(c.space, key, call); got != w {
					t.Errorf("requestID(%s, %s, %q) = %s, want %s", c.caller, c.kind, call, got, w)
					return
				}
			}
		})
	}
	wg.Wait()
}
