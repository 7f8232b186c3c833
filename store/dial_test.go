package store_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

func TestAuditRedisURL(t *testing.T) {
	tests := []struct {
		url     string
		want    string // client type
		wantErr string
	}{
		{"redis://localhost:6379/0", "*redis.Client", ""},
		{"rediss://user:pw@redis.example.com:6380/2", "*redis.Client", ""},
		{"redis://:pw@s1:26379,s2:26379,s3/0?master_name=mymaster&sentinel_password=sp", "*redis.Client", ""},
		{"redis://n1:6379,n2:6379,n3:6379", "*redis.ClusterClient", ""},
		{"rediss://n1,n2?dial_timeout=3s", "*redis.ClusterClient", ""},
		{"redis://n1:6379,n2:6379/3", "", "only database 0"},
		{"", "", "required"},
		{"http://localhost", "", "invalid URL scheme"},
		{"redis://:s3cret@host:6379/0?bogus=1", "", "unexpected option"},
	}
	for _, tt := range tests {
		rdb, err := store.Dial(tt.url)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("store.Dial(%q) = %v, want error with %q", tt.url, err, tt.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Errorf("store.Dial(%q) error %q shows the password", tt.url, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("store.Dial(%q) = %v", tt.url, err)
			continue
		}
		if got := fmt.Sprintf("%T", rdb); got != tt.want {
			t.Errorf("store.Dial(%q) = %s, want %s", tt.url, got, tt.want)
		}
		rdb.Close()
	}

	// The single-node form reaches the test Redis.
	rdb, _ := storetest.New(t)
	c, err := store.Dial(dialURL(t, rdb))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Errorf("Ping via Dial = %v", err)
	}
}

// dialURL is the URL of the test Redis: REDIS_URL, or the embedded one's.
func dialURL(tb testing.TB, rdb redis.UniversalClient) string {
	tb.Helper()
	if storetest.Real() {
		return os.Getenv(storetest.EnvURL)
	}
	c, ok := rdb.(*redis.Client)
	if !ok {
		tb.Fatalf("storetest client is %T, want *redis.Client", rdb)
	}
	return fmt.Sprintf("redis://%s/%d", c.Options().Addr, c.Options().DB)
}

// TestCheckSettings: each bad Redis setting is one error naming its
// variable, and a password in the URL is never repeated.
func TestCheckSettings(t *testing.T) {
	if errs := store.CheckSettings("redis://n1:6379,n2:6379,n3:6379", 0, 1); len(errs) != 0 {
		t.Errorf("CheckSettings(a Cluster URL) = %v, want none", errs)
	}
	errs := store.CheckSettings("redis://:s3cret@host:6379/0?bogus=1", -time.Second, -1)
	var got []string
	for _, err := range errs {
		got = append(got, err.Error())
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{"REDIS_URL: ", "COUNTERSIGN_REDIS_START_TIMEOUT: must not be negative, got -1s",
		"COUNTERSIGN_REDIS_WAIT_REPLICAS: must not be negative, got -1"} {
		if !strings.Contains(all, want) {
			t.Errorf("CheckSettings errors:\n%s\nwant one with %q", all, want)
		}
	}
	if len(errs) != 3 || strings.Contains(all, "s3cret") {
		t.Errorf("CheckSettings errors:\n%s\nwant 3, without the password", all)
	}
}
