package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// TestDemoCommand runs `countersign demo` as a user would: it prints the
// page's URL, the page is served, and cancelling (Ctrl-C) stops it cleanly
// with exit code 0.
func TestDemoCommand(t *testing.T) {
	for _, v := range []string{"REDIS_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL"} {
		t.Setenv(v, "") // restored after the test; unset: embedded Redis and the scripted model, as on a fresh machine
		os.Unsetenv(v)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		code := run(ctx, []string{"demo", "--addr", "127.0.0.1:0"}, stdio{Stdout: pw, Stderr: pw})
		pw.Close()
		done <- code
	}()

	lines := bufio.NewScanner(pr)
	var url string
	for lines.Scan() {
		if _, after, ok := strings.Cut(lines.Text(), "Countersign demo is running: "); ok {
			url = strings.TrimSpace(after)
			break
		}
	}
	if url == "" {
		t.Fatalf("demo printed no URL (exit %d)", <-done)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }() // keep draining output

	resp, err := http.Get(url + "/")
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "<html") {
		t.Fatalf("GET %s = %d, want the workspace page", url, resp.StatusCode)
	}

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("demo exit = %d after Ctrl-C, want 0", code)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("demo did not stop within 15 s of Ctrl-C")
	}
}
