package slacksimtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
)

// shared is the test binary's one browser process, started by the first
// Browser call and stopped by Main after the last test: a Chromium costs
// ~2 s to start and 4.5–5.5 s of CPU on the 2-core machine (about half of
// it in the seconds after it first answers), once per test before.
var shared struct {
	mu      sync.Mutex         // guards the fields below
	main    bool               // Main is running the package's tests
	started bool               // start was tried: ctx or err is set
	ctx     context.Context    // the browser's first tab, parent of every test's tab
	cancel  context.CancelFunc // stops the process
	err     error              // why the browser did not start
}

// Main runs the package's tests (m.Run) and then stops the browser that
// Browser started, so that no Chromium outlives the test binary. A package
// whose tests call Browser calls it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(slacksimtest.Main(m)) }
func Main(m *testing.M) int {
	shared.mu.Lock()
	shared.main = true
	shared.mu.Unlock()
	code := m.Run()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.cancel != nil {
		shared.cancel() // kills the process and waits for it; the allocator removes its profile
	}
	return code
}

// Browser returns a chromedp context on a new tab of Debian's chromium (or
// another Chrome) with a width×height viewport, closed when the test ends;
// the tab's session is bounded by one 60 s deadline. The test binary shares
// one browser process, started on first use and stopped by Main (which the
// package's TestMain must call); each tab has a browser context of its own
// (an empty profile: no cookies, storage or cache from another test) in a
// window of its own, so that parallel tests do not meet. Without a
// browser, or under -short, the test is skipped with a loud message — and
// fails when CI=true, where browser tests are part of the acceptance.
func Browser(tb testing.TB, width, height int) context.Context {
	tb.Helper()
	shared.mu.Lock()
	inMain := shared.main
	shared.mu.Unlock()
	if !inMain {
		// Checked before the skips, so that a package without it fails
		// on every machine, not only where Chromium is installed.
		tb.Fatal("Browser: the package's TestMain must run its tests with slacksimtest.Main, which stops the shared browser")
	}
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
	browserCtx, err := sharedBrowser(path, width, height)
	if err != nil {
		tb.Fatalf("start %s: %v", path, err)
	}
	ctx, cancel := context.WithTimeout(browserCtx, 60*time.Second)
	tabCtx, cancelTab := chromedp.NewContext(ctx, chromedp.WithNewBrowserContext())
	tb.Cleanup(func() {
		cancelTab() // closes the tab and disposes of its browser context
		cancel()
	})
	// The screen too, so that nothing on the page depends on the shared
	// window's size.
	screen := func(p *emulation.SetDeviceMetricsOverrideParams, _ *emulation.SetTouchEmulationEnabledParams) {
		p.ScreenWidth, p.ScreenHeight = int64(width), int64(height)
	}
	if err := chromedp.Do(tabCtx, chromedp.EmulateViewport(int64(width), int64(height), screen)); err != nil {
		tb.Fatalf("open a tab in %s: %v", path, err)
	}
	return tabCtx
}

// sharedBrowser starts the test binary's browser on the first call (its
// windows width×height) and returns its context, or why it could not.
func sharedBrowser(path string, width, height int) (context.Context, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.started {
		return shared.ctx, shared.err
	}
	shared.started = true
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
		chromedp.WindowSize(width, height),
		// No UserDataDir: the allocator makes a temporary profile and
		// removes it when the browser stops.
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelBrowser := chromedp.NewContext(allocCtx)
	cancel := func() {
		cancelBrowser()
		cancelAlloc()
	}
	// The first Do starts the process and ties its life to ctx (not to a
	// test's context, which ends with the test).
	if err := chromedp.Do(ctx); err != nil {
		cancel()
		shared.err = err
		return nil, err
	}
	shared.ctx, shared.cancel = ctx, cancel
	return ctx, nil
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

// TextNow returns the rendered text (innerText) of the first element
// matching the XPath expression, read inside the page in one step and
// retried (up to 10 s) until the element exists with some text: as for
// ClickNow, a node that chromedp found may be replaced by a re-render
// before chromedp.Text reads it, which then reads "".
func TextNow(xpath string) chromedp.Action[string] {
	js := fmt.Sprintf(`(() => {
		const el = document.evaluate(%q, document, null, XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue;
		return el ? el.innerText : "";
	})()`, xpath)
	return func(ctx context.Context, tg *chromedp.Target) (string, error) {
		text, err := chromedp.Poll[string](js, chromedp.WithPollingTimeout(10*time.Second))(ctx, tg)
		if err != nil {
			return "", fmt.Errorf("text of %s: %w", xpath, err)
		}
		return text, nil
	}
}
