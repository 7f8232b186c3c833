// Package healthcheck is `countersign healthcheck`: a GET of a running
// serve's /readyz (or a path or URL given) on this machine, for container
// health checks in an image with no shell and no curl.
package healthcheck

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/countersign/countersign/cmd/countersign/config"
)

const healthcheckUsage = `usage: countersign healthcheck [path or URL]

Asks a running countersign serve on this machine whether it is ready: a GET
of /readyz (Redis answers PING, Slack auth.test passes) on the port of
COUNTERSIGN_ADDR, or of the path or URL given (/healthz: the process serves
HTTP). Exit 0 on 200, 1 otherwise with the answer on stderr. For container
health checks: the image has no shell and no curl (compose.yaml uses it).
`

// healthcheckTimeout bounds the whole probe; Docker's own timeout for a
// health check is 30 s by default, /readyz answers within 5 s.
const healthcheckTimeout = 10 * time.Second

// Run GETs serve's /readyz (or the path or URL in args, given without
// "healthcheck") and returns 0 when it answers 200.
func Run(ctx context.Context, args []string, std config.Stdio) int {
	target := "/readyz"
	switch {
	case len(args) > 0 && config.IsHelp(args[0]):
		fmt.Fprint(std.Stdout, healthcheckUsage)
		return 0
	case len(args) > 1:
		fmt.Fprintf(std.Stderr, "countersign healthcheck: one path or URL, got %q\n\n%s", args, healthcheckUsage)
		return 2
	case len(args) == 1:
		target = args[0]
	}
	url := target
	if strings.HasPrefix(target, "/") {
		cfg, err := config.Load()
		if err != nil {
			fmt.Fprintln(std.Stderr, "countersign healthcheck:", err)
			return 2
		}
		base, err := localURL(cfg.Addr)
		if err != nil {
			fmt.Fprintf(std.Stderr, "countersign healthcheck: COUNTERSIGN_ADDR %q: %v\n", cfg.Addr, err)
			return 2
		}
		url = base + target
	}
	ctx, cancel := context.WithTimeout(ctx, healthcheckTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		fmt.Fprintf(std.Stderr, "countersign healthcheck: %v\n", err)
		return 2
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(std.Stderr, "countersign healthcheck: %v\n", err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(std.Stderr, "countersign healthcheck: %s answered %s: %s\n", url, resp.Status, strings.TrimSpace(string(body)))
		return 1
	}
	fmt.Fprintf(std.Stdout, "%s: %s\n", url, strings.TrimSpace(string(body)))
	return 0
}

// localURL turns a listen address (":8080", "0.0.0.0:8080",
// "10.0.0.5:8080") into the base URL that reaches it from this machine.
func localURL(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	switch host {
	case "", "0.0.0.0", "::":
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port), nil
}
