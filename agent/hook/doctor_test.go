package hook_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/hook"
)

// settings is a settings.json with one PreToolUse hook entry.
func settings(entry string) []byte {
	return []byte(`{"hooks":{"PreToolUse":[{"matcher":"*","hooks":[` + entry + `]}]}}`)
}

const goodEntry = `{"type":"command","command":"countersign hook claude-code --timeout 11m","timeout":720,"onFailure":"block"}`

// TestHookDoctor: the doctor finds what would let a call run unapproved or
// leave a card waiting — a CLI older than MinVersion, a hook without
// "onFailure": "block", Claude Code's timeout not above the hook's wait,
// the policy's deadlines not below it, --defer where interactive sessions
// read it — and says exactly what to change; a sound installation is all
// ok.
func TestHookDoctor(t *testing.T) {
	ver := func(v string) func(context.Context) (string, error) {
		return func(context.Context) (string, error) { return v, nil }
	}
	short := []hook.PolicyWait{{Tool: "Bash", Timeout: 10 * time.Minute}, {Tool: "external (any other tool)", Timeout: 10 * time.Minute}}
	for _, tt := range []struct {
		name     string
		o        hook.DoctorOptions
		fix      []string // each a FIX finding must say
		allOK    bool
		okSaying string
	}{
		{name: "sound", allOK: true, okSaying: "Claude Code 2.1.332",
			o: hook.DoctorOptions{Version: ver("2.1.332 (Claude Code)\n"), Settings: []hook.SettingsFile{{Path: "u.json", Data: settings(goodEntry), Interactive: true}}, Waits: short}},
		{name: "the first version with onFailure", allOK: true, okSaying: "Claude Code 2.1.295",
			o: hook.DoctorOptions{Version: ver("2.1.295 (Claude Code)"), Settings: []hook.SettingsFile{{Path: "u.json", Data: settings(goodEntry)}}, Waits: short}},
		{name: "Node 20's CLI", fix: []string{"Claude Code 2.1.197 is older than 2.1.295", "ignores \"onFailure\": \"block\"", "npm install -g @anthropic-ai/claude-code@latest"},
			o: hook.DoctorOptions{Version: ver("2.1.197 (Claude Code)"), Settings: []hook.SettingsFile{{Path: "u.json", Data: settings(goodEntry)}}, Waits: short}},
		{name: "one before", fix: []string{"Claude Code 2.1.294 is older than 2.1.295"},
			o: hook.DoctorOptions{Version: ver("2.1.294 (Claude Code)"), Settings: []hook.SettingsFile{{Path: "u.json", Data: settings(goodEntry)}}, Waits: short}},
		{name: "no claude", fix: []string{"claude --version: exec: \"claude\": executable file not found", "--claude"},
			o: hook.DoctorOptions{Version: func(context.Context) (string, error) {
				return "", errors.New(`exec: "claude": executable file not found in $PATH`)
			}, Settings: []hook.SettingsFile{{Path: "u.json", Data: settings(goodEntry)}}, Waits: short}},
		{name: "no onFailure", fix: []string{`u.json: hooks.PreToolUse[0].hooks[0]`, `"onFailure" is "": set "onFailure": "block" on it`},
			o: hook.DoctorOptions{Version: ver("2.1.332"), Settings: []hook.SettingsFile{{Path: "u.json",
				Data: settings(`{"type":"command","command":"countersign hook claude-code --timeout 11m","timeout":720}`)}}, Waits: short}},
		{name: "Claude Code's default timeout under the hook's wait", fix: []string{`Claude Code's "timeout" (10m0s, the default) is not above the hook's wait (11m0s): set "timeout": 720`},
			o: hook.DoctorOptions{Version: ver("2.1.332"), Settings: []hook.SettingsFile{{Path: "u.json",
				Data: settings(`{"type":"command","command":"countersign hook claude-code --timeout 11m","onFailure":"block"}`)}}, Waits: short}},
		{name: "equal timeouts", fix: []string{`Claude Code's "timeout" (9m0s) is not above the hook's wait (9m0s): set "timeout": 600`},
			o: hook.DoctorOptions{Version: ver("2.1.332"), Settings: []hook.SettingsFile{{Path: "u.json",
				Data: settings(`{"type":"command","command":"countersign hook claude-code","timeout":540,"onFailure":"block"}`)}},
				Waits: []hook.PolicyWait{{Tool: "Bash", Timeout: 5 * time.Minute}}}},
		{name: "the policy's 4h external deadline", fix: []string{"the policy's deadlines are not all below the hook's wait (11m0s): external (any other tool) 4h0m0s", "Set `timeout:` below 11m0s"},
			o: hook.DoctorOptions{Version: ver("2.1.332"), Settings: []hook.SettingsFile{{Path: "u.json", Data: settings(goodEntry)}},
				Waits: []hook.PolicyWait{{Tool: "Bash", Timeout: 10 * time.Minute}, {Tool: "external (any other tool)", Timeout: 4 * time.Hour}}}},
		{name: "no policy given", fix: []string{"the policy's timeouts were not checked (no policy read: pass --policy FILE)"},
			o: hook.DoctorOptions{Version: ver("2.1.332"), Settings: []hook.SettingsFile{{Path: "u.json", Data: settings(goodEntry)}}}},
		{name: "an http hook", fix: []string{"(http https://cs.example.com/hooks/claude-code?timeout=20m)", `Claude Code's "timeout" (15m0s) is not above the hook's wait (20m0s): set "timeout": 1260`},
			o: hook.DoctorOptions{Version: ver("2.1.332"), Settings: []hook.SettingsFile{{Path: "u.json",
				Data: settings(`{"type":"http","url":"https://cs.example.com/hooks/claude-code?timeout=20m","timeout":900,"onFailure":"block"}`)}}, Waits: short}},
		{name: "--defer where interactive sessions read it", fix: []string{"--defer in a settings file interactive sessions load", "claude -p --settings FILE"},
			o: hook.DoctorOptions{Version: ver("2.1.332"), Settings: []hook.SettingsFile{{Path: "u.json", Interactive: true,
				Data: settings(`{"type":"command","command":"countersign hook claude-code --defer --timeout 11m","timeout":720,"onFailure":"block"}`)}}, Waits: short}},
		{name: "--defer in a claude -p run's file", allOK: true, okSaying: `"onFailure": "block"`,
			o: hook.DoctorOptions{Version: ver("2.1.332"), Settings: []hook.SettingsFile{{Path: "p.json",
				Data: settings(`{"type":"command","command":"countersign hook claude-code --defer --timeout 11m","timeout":720,"onFailure":"block"}`)}}, Waits: short}},
		{name: "no hook", fix: []string{"no PreToolUse hook runs countersign hook claude-code", "u.json", "section 2"},
			o: hook.DoctorOptions{Version: ver("2.1.332"), Settings: []hook.SettingsFile{{Path: "u.json", Data: []byte(`{"permissions":{}}`)}}, Waits: short}},
		{name: "unreadable settings", fix: []string{"u.json: unexpected end of JSON input", "fix the JSON"},
			o: hook.DoctorOptions{Version: ver("2.1.332"), Settings: []hook.SettingsFile{{Path: "u.json", Data: []byte(`{"hooks":`)}}, Waits: short}},
		{name: "a bad --timeout", fix: []string{`--timeout "11" is not a duration such as 9m`},
			o: hook.DoctorOptions{Version: ver("2.1.332"), Settings: []hook.SettingsFile{{Path: "u.json",
				Data: settings(`{"type":"command","command":"countersign hook claude-code --timeout 11","timeout":720,"onFailure":"block"}`)}}, Waits: short}},
		{name: "a key the server refuses", fix: []string{"the API key: countersign: 401 unauthenticated"},
			o: hook.DoctorOptions{Version: ver("2.1.332"), Settings: []hook.SettingsFile{{Path: "u.json", Data: settings(goodEntry)}}, Waits: short,
				Self: func(context.Context) (string, []string, error) {
					return "", nil, errors.New("countersign: 401 unauthenticated: unknown API key")
				}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fs := hook.Doctor(context.Background(), tt.o)
			var out strings.Builder
			all := hook.WriteFindings(&out, fs)
			if all != tt.allOK {
				t.Fatalf("all ok = %v, want %v:\n%s", all, tt.allOK, out.String())
			}
			if tt.okSaying != "" && !strings.Contains(out.String(), tt.okSaying) {
				t.Errorf("findings do not say %q:\n%s", tt.okSaying, out.String())
			}
			var fixes []string
			for _, f := range fs {
				if !f.OK {
					fixes = append(fixes, f.Text)
				}
			}
			for _, w := range tt.fix {
				found := false
				for _, f := range fixes {
					found = found || strings.Contains(f, w)
				}
				if !found {
					t.Errorf("no FIX says %q:\n%s", w, out.String())
				}
			}
			if len(fixes) > 0 && !strings.HasPrefix(out.String(), "FIX ") {
				t.Errorf("problems are not listed first:\n%s", out.String())
			}
		})
	}
}
