package slacksimtest_test

import (
	"testing"

	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
)

func TestNewAndClient(t *testing.T) {
	ws := slacksimtest.New(t, slacksim.Options{})
	cast := ws.SeedDemo()
	api := slacksimtest.Client(ws, "", "")
	if _, _, err := api.PostMessage(cast.Approvals.ID); err == nil || err.Error() != "no_text" {
		t.Errorf("PostMessage(no text) error = %v, want no_text", err)
	}
	got, err := api.AuthTest()
	if err != nil || got.UserID != slacksim.BotUserID {
		t.Errorf("AuthTest() = %+v, %v", got, err)
	}
}
