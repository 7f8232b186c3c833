package mcp

import (
	"maps"
	"slices"
	"strings"
)

// inherited are the variables of the gateway's own environment a stdio
// upstream gets, beside its policy env: where programs are (PATH), who and
// where it runs (HOME, USER, LOGNAME, SHELL, TERM, TMPDIR, TZ) and the
// locale (LANG, LANGUAGE, LC_*). The MCP SDKs' stdio clients pass a
// similar list (the TypeScript SDK's getDefaultEnvironment: HOME, LOGNAME,
// PATH, SHELL, TERM, USER). Nothing else is passed: the gateway's process
// holds Slack tokens, the Redis URL, the model's key and Countersign's own
// API key, none of which an upstream should see.
var inherited = []string{"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TMPDIR", "TZ", "LANG", "LANGUAGE"}

// Environ is the environment of a stdio upstream: the inherited variables
// of parent (an os.Environ list), then env (the upstream's env from the
// policy, resolved), which wins. A value starting with "()" is a shell
// function exported by bash and is left out, as the SDKs do.
func Environ(parent []string, env map[string]string) []string {
	var out []string
	for _, kv := range parent {
		k, v, ok := strings.Cut(kv, "=")
		if _, set := env[k]; !ok || set || strings.HasPrefix(v, "()") {
			continue
		}
		if slices.Contains(inherited, k) || strings.HasPrefix(k, "LC_") {
			out = append(out, kv)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}
