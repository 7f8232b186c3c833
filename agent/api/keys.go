package api

import (
	"net/http"
	"slices"

	"github.com/countersign/countersign/agent/api/client"
)

// KeyView is the body of GET /v1/keys/self: the calling key's name and
// the tools it may ask for. It is the Go client's Key.
type KeyView = client.Key

// keySelf is GET /v1/keys/self: what the calling key may ask for, so a
// caller (the MCP gateway's tools/list) shows only those tools.
func (s *Server) keySelf(w http.ResponseWriter, _ *http.Request, c call) {
	writeJSON(w, http.StatusOK, KeyView{Name: c.key.Name, Tools: slices.Clip(append([]string{}, c.key.Tools...))})
}
