package policyfile

import (
	"encoding/json"
	"os"
)

// This file: reading the parts of a File that depend on the process (its
// environment, the tools it declares) the way every command does.

// Resolve reads what the upstream takes from the environment: each Env
// value with ${VAR} expanded, and each HeadersEnv header's value. env is
// the lookup (os.Getenv in a process); maps are nil when the file sets
// none.
func (u Upstream) Resolve(env func(string) string) (vars, headers map[string]string) {
	if len(u.Env) > 0 {
		vars = map[string]string{}
		for k, v := range u.Env {
			vars[k] = os.Expand(v, env)
		}
	}
	if len(u.HeadersEnv) > 0 {
		headers = map[string]string{}
		for h, name := range u.HeadersEnv {
			headers[h] = env(name)
		}
	}
	return vars, headers
}

// ValidateDeclaredArgs is ValidateArgs for a tool the file declares; a
// tool it does not declare (another agent's, asked for through the HTTP
// API) has no schema here and passes.
func (f *File) ValidateDeclaredArgs(tool string, args json.RawMessage) error {
	if _, ok := f.Tool(tool); !ok {
		return nil
	}
	return f.ValidateArgs(tool, args)
}
