package main_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/countersign/countersign/cmd/countersign/demo"
)

// TestReadmeIsAFrontDoor (issue 47): the README fits on a screen or two
// (at most 150 lines), and every link in it and in the docs index
// resolves: the file exists, and a #fragment names one of its headings.
func TestReadmeIsAFrontDoor(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > 150 {
		t.Errorf("README.md has %d lines, want at most 150: move reference material to docs/", n)
	}
	for _, doc := range []string{"../../README.md", "../../docs/README.md", "../../docs/guide.md"} {
		checkLinks(t, doc)
	}
}

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	notAnchor = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// checkLinks checks every relative link of the markdown file doc.
func checkLinks(t *testing.T, doc string) {
	t.Helper()
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	inFence := false
	var text strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if !inFence {
			text.WriteString(line + "\n")
		}
	}
	for _, m := range mdLink.FindAllStringSubmatch(text.String(), -1) {
		url := m[1]
		if strings.HasPrefix(url, "http://") || strings.HasPrefix(url, "https://") || strings.HasPrefix(url, "mailto:") {
			continue
		}
		file, frag, _ := strings.Cut(url, "#")
		target := doc
		if file != "" {
			target = filepath.Join(filepath.Dir(doc), file)
		}
		if _, err := os.Stat(target); err != nil {
			t.Errorf("%s: link %q: %v", doc, url, err)
			continue
		}
		if frag == "" || !strings.HasSuffix(target, ".md") {
			continue
		}
		tb, err := os.ReadFile(target)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, h := range mdHeading.FindAllStringSubmatch(string(tb), -1) {
			if anchor(h[1]) == frag {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("%s: link %q: %s has no heading with that anchor", doc, url, target)
		}
	}
}

// anchor is GitHub's anchor of a heading: lower case, punctuation but
// hyphens and underscores dropped, spaces as hyphens.
func anchor(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	h = notAnchor.ReplaceAllString(h, "")
	return strings.ReplaceAll(h, " ", "-")
}

// TestBannerCommandsForTheRunningBinary (issue 47): the demo's banner
// writes its commands for the program as the person started it — an
// installed binary by its name (or path), go run only under go run.
func TestBannerCommandsForTheRunningBinary(t *testing.T) {
	onPath := func(name string) (string, error) {
		if name == "countersign" {
			return "/usr/local/bin/countersign", nil
		}
		return "", os.ErrNotExist
	}
	for _, tc := range []struct{ exe, want string }{
		{"/usr/local/bin/countersign", "countersign"},
		{"/home/dana/bin/countersign", "/home/dana/bin/countersign"},
		{"/opt/cs/countersign-linux", "/opt/cs/countersign-linux"},
		{"/tmp/go-build123456/b001/exe/countersign", demo.GoRun},
		{"/tmp/go-build123456/b001/countersign.test", "/tmp/go-build123456/b001/countersign.test"},
	} {
		if got := demo.SelfCommand(tc.exe, onPath); got != tc.want {
			t.Errorf("SelfCommand(%q) = %q, want %q", tc.exe, got, tc.want)
		}
	}
	w := demo.World{Command: "/home/dana/bin/countersign"}
	w.Settings.AuditPublicKeyFile = "/tmp/demo/audit.pub"
	if got := w.VerifyCommand(); !strings.Contains(got, " /home/dana/bin/countersign audit verify --pubkey /tmp/demo/audit.pub") || strings.Contains(got, "go run") {
		t.Errorf("VerifyCommand() = %q, want the running binary's audit verify", got)
	}
}
