package option_test

import (
	"context"
	"testing"
	"time"

	"github.com/countersign/countersign/approval/clock"
	"github.com/countersign/countersign/approval/option"
)

func TestPositiveOr(t *testing.T) {
	for _, tt := range []struct {
		name    string
		v, want time.Duration
	}{
		{"unset", 0, time.Second},
		{"negative means the default", -time.Minute, time.Second},
		{"set", time.Minute, time.Minute},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := option.PositiveOr(tt.v, time.Second); got != tt.want {
				t.Errorf("PositiveOr(%v, 1s) = %v, want %v", tt.v, got, tt.want)
			}
		})
	}
}

func TestFuncOr(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	fixed := func() time.Time { return at }
	if got := option.FuncOr(nil, fixed)(); !got.Equal(at) {
		t.Errorf("FuncOr(nil, fixed)() = %v, want the default's %v", got, at)
	}
	if got := option.FuncOr(fixed, time.Now)(); !got.Equal(at) {
		t.Errorf("FuncOr(fixed, time.Now)() = %v, want the set function's %v", got, at)
	}
	type ticker func(d time.Duration) (<-chan time.Time, func())
	var unset ticker
	c, stop := option.FuncOr(unset, clock.NewTicker)(time.Hour)
	defer stop()
	if c == nil {
		t.Error("FuncOr(nil ticker, NewTicker) made no channel")
	}
	sleep := option.FuncOr(nil, clock.Sleep)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := sleep(ctx, time.Hour); err == nil {
		t.Error("the default sleep with a cancelled ctx = nil, want ctx's error")
	}
}
