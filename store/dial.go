package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client is a Redis client: a single node, a Sentinel-managed master or a
// Cluster, as Dial returns it. Everything in this package takes one.
type Client = redis.UniversalClient

// Dial builds the Redis client from REDIS_URL; errors do not name the
// variable (callers do) and never contain the URL's password. One form covers a single
// node, Sentinel and Cluster, so store code (which takes a
// redis.UniversalClient) never knows which it talks to:
//
//	redis://[user:pass@]host:6379/0           one node
//	rediss://...                              one node over TLS
//	redis://h1:26379,h2:26379/0?master_name=m Sentinel (addresses are the sentinels')
//	redis://h1:6379,h2:6379,h3:6379           Cluster (several addresses, no master_name)
//
// Sentinel also takes sentinel_username and sentinel_password. Every other
// query option is go-redis's (dial_timeout, pool_size, ...), see
// redis.ParseURL. With several TLS hosts each is verified under its own name.
func Dial(rawURL string) (Client, error) {
	if rawURL == "" {
		return nil, errors.New("required, e.g. redis://localhost:6379/0")
	}
	// net/url rejects "h1:1,h2:2" as a host, so the address list is cut out
	// of the authority first and the URL is parsed with the first address.
	var addrs []string
	if scheme, rest, ok := strings.Cut(rawURL, "://"); ok && (scheme == "redis" || scheme == "rediss") {
		end := strings.IndexAny(rest, "/?#")
		if end < 0 {
			end = len(rest)
		}
		authority := rest[:end]
		userinfo, hosts := "", authority
		if at := strings.LastIndexByte(authority, '@'); at >= 0 {
			userinfo, hosts = authority[:at+1], authority[at+1:]
		}
		for _, h := range strings.Split(hosts, ",") {
			if h = strings.TrimSpace(h); h != "" {
				addrs = append(addrs, h)
			}
		}
		if len(addrs) == 0 {
			return nil, errors.New("no host")
		}
		rawURL = scheme + "://" + userinfo + addrs[0] + rest[end:]
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, redactURLError(err)
	}
	q := u.Query()
	master := q.Get("master_name")
	sentinelUser, sentinelPass := q.Get("sentinel_username"), q.Get("sentinel_password")
	q.Del("master_name")
	q.Del("sentinel_username")
	q.Del("sentinel_password")
	u.RawQuery = q.Encode()

	opt, err := redis.ParseURL(u.String())
	if err != nil {
		return nil, redactURLError(err)
	}
	// Deadlines of ctx bound every command (without this go-redis waits
	// ReadTimeout whatever ctx says): a Slack answer has 3 s, whatever
	// Redis does.
	opt.ContextTimeoutEnabled = true
	if len(addrs) <= 1 && master == "" {
		return redis.NewClient(opt), nil
	}
	for i, a := range addrs {
		if !strings.Contains(a, ":") || strings.HasSuffix(a, "]") {
			addrs[i] = a + ":6379"
		}
	}
	if master == "" && opt.DB != 0 {
		return nil, fmt.Errorf("redis Cluster has only database 0, got /%d", opt.DB)
	}
	if opt.TLSConfig != nil && len(addrs) > 1 {
		opt.TLSConfig.ServerName = "" // verify each node under the host it is dialled by
	}
	return redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:            addrs,
		MasterName:       master,
		DB:               opt.DB,
		Username:         opt.Username,
		Password:         opt.Password,
		SentinelUsername: sentinelUser,
		SentinelPassword: sentinelPass,
		ClientName:       opt.ClientName,
		Protocol:         opt.Protocol,
		MaxRetries:       opt.MaxRetries,
		MinRetryBackoff:  opt.MinRetryBackoff,
		MaxRetryBackoff:  opt.MaxRetryBackoff,
		DialTimeout:      opt.DialTimeout,
		ReadTimeout:      opt.ReadTimeout,
		WriteTimeout:     opt.WriteTimeout,
		PoolFIFO:         opt.PoolFIFO,
		PoolSize:         opt.PoolSize,
		PoolTimeout:      opt.PoolTimeout,
		MinIdleConns:     opt.MinIdleConns,
		MaxIdleConns:     opt.MaxIdleConns,
		MaxActiveConns:   opt.MaxActiveConns,
		ConnMaxIdleTime:  opt.ConnMaxIdleTime,
		ConnMaxLifetime:  opt.ConnMaxLifetime,
		TLSConfig:        opt.TLSConfig,

		ContextTimeoutEnabled: true,
	}), nil
}

// CheckSettings checks a process's Redis settings before anything is
// built: the URL is one Dial takes (nothing is dialled), the start-up
// timeout and the replicas to wait for are not negative. Each error names
// the environment variable the setting is read from (REDIS_URL,
// COUNTERSIGN_REDIS_START_TIMEOUT, COUNTERSIGN_REDIS_WAIT_REPLICAS).
func CheckSettings(redisURL string, startTimeout time.Duration, waitReplicas int) []error {
	var errs []error
	if rdb, err := Dial(redisURL); err != nil {
		errs = append(errs, fmt.Errorf("REDIS_URL: %w", err))
	} else {
		_ = rdb.Close()
	}
	if startTimeout < 0 {
		errs = append(errs, fmt.Errorf("COUNTERSIGN_REDIS_START_TIMEOUT: must not be negative, got %s", startTimeout))
	}
	if waitReplicas < 0 {
		errs = append(errs, fmt.Errorf("COUNTERSIGN_REDIS_WAIT_REPLICAS: must not be negative, got %d", waitReplicas))
	}
	return errs
}

// redactURLError drops the URL (which may hold a password) from a url
// parse error, keeping what went wrong.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}

// RedactURL is u with any password replaced by "xxxxx", for printing. It
// works on the Cluster form too (several host:port in the authority),
// which net/url cannot parse.
func RedactURL(u string) string {
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok {
		return u
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority := rest[:end]
	at := strings.LastIndex(authority, "@")
	if at < 0 {
		return u
	}
	user, _, hasPassword := strings.Cut(authority[:at], ":")
	if !hasPassword {
		return u
	}
	return scheme + "://" + user + ":xxxxx" + authority[at:] + rest[end:]
}

// SetLogger hands go-redis's internal log lines (a process-wide setting of
// the library) to log at debug level. Only main calls it.
func SetLogger(log *slog.Logger) { redis.SetLogger(redisLogger{log}) }

// redisLogger hands go-redis's internal log lines to slog at debug level.
type redisLogger struct{ log *slog.Logger }

// Printf implements go-redis's internal logging interface.
func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(format, v...))
}

// AwaitReady pings rdb until it answers, for at most wait (0: once),
// backing off from 100 ms to 2 s between attempts and logging once that
// it waits. Only a Redis that cannot answer yet (connection refused, a
// timeout, LOADING) is waited for; an answer refusing us (a wrong
// password, a database a Cluster lacks) is a misconfiguration and returned
// at once. The backoff runs on wall-clock time: it waits for a network.
func AwaitReady(ctx context.Context, rdb Client, wait time.Duration, log *slog.Logger) error {
	deadline := time.Now().Add(wait)
	backoff := 100 * time.Millisecond
	waited := false
	for {
		err := rdb.Ping(ctx).Err()
		if err == nil {
			if waited {
				log.Info("redis reachable")
			}
			return nil
		}
		if !starting(err) || wait <= 0 {
			return err
		}
		if !waited {
			log.Warn("redis not reachable yet; retrying", "for", wait.String(), "err", err)
			waited = true
		}
		if !time.Now().Add(backoff).Before(deadline) {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// starting reports whether err from a PING may go away by itself: no
// answer at all, or Redis still loading its data.
func starting(err error) bool {
	var re redis.Error
	if errors.As(err, &re) {
		return strings.HasPrefix(re.Error(), "LOADING")
	}
	return true
}

// Ready is a readiness check of rdb: a PING.
func Ready(rdb Client) func(ctx context.Context) error {
	return func(ctx context.Context) error { return rdb.Ping(ctx).Err() }
}
