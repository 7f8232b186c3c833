package slacksim

import (
	"net/http"
)

// Handler serves the Web API under /api/, Socket Mode at /ws, response_urls
// under /response/, and the browser UI at / with its JSON and SSE
// endpoints under /ui/.
func (w *Workspace) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/api/", w.serveAPI)
	mux.HandleFunc("/ws", w.serveSocket)
	mux.HandleFunc("/response/", w.serveResponseURL)
	w.uiRoutes(mux)
	return mux
}

func (w *Workspace) uiRoutes(mux *http.ServeMux) {}
