package slacksimtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Browser returns a chromedp context on Debian's chromium (or another
// Chrome) with a fresh profile and a width×height viewport, closed when the
// test ends; the whole browser session is bounded by one 60 s deadline.
// Without a browser, or under -short, the test is skipped with a loud
// message — and fails when CI=true, where browser tests are part of the
// acceptance.
func Browser(tb testing.TB, width, height int) context.Context {
	tb.Helper()
	ci := os.Getenv("CI") == "true"
	if testing.Short() {
		if ci {
			tb.Fatal("CI=true but -short given: browser tests must run in CI")
		}
		tb.Skip("SKIPPING BROWSER TEST: -short given; the page is not checked in a real browser")
	}
	var path string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		if ci {
			tb.Fatal("CI=true but no chromium, chromium-browser or google-chrome in PATH: install Debian's chromium")
		}
		tb.Skip("SKIPPING BROWSER TEST: no chromium, chromium-browser or google-chrome in PATH " +
			"(apt-get install chromium); the page is NOT checked in a real browser")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(tb.TempDir()),
		chromedp.WindowSize(width, height),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	tb.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
		cancel()
	})
	if err := chromedp.Do(bctx, chromedp.EmulateViewport(int64(width), int64(height))); err != nil {
		tb.Fatalf("start %s: %v", path, err)
	}
	return bctx
}

// ClickNow clicks the first element matching the XPath expression,
// finding and clicking it in one step inside the page and retrying (up to
// 10 s) until it exists: the workspace page re-renders on live updates, so
// a node found by one chromedp command may be gone by the next
// ("Could not find node with given id").
func ClickNow(xpath string) chromedp.Action[chromedp.Void] {
	js := fmt.Sprintf(`(() => {
		const el = document.evaluate(%q, document, null, XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue;
		if (!el) return false;
		el.click();
		return true;
	})()`, xpath)
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Poll[bool](js, chromedp.WithPollingTimeout(10*time.Second))(ctx, tg)
		if err != nil {
			return fmt.Errorf("click %s: %w", xpath, err)
		}
		return nil
	})
}
