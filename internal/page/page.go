// Package page serves the admin port's small status pages (/slo,
// /probes) as HTML for browsers and JSON for everything else that asks.
package page

import (
	"encoding/json"
	"html/template"
	"net/http"
	"strings"
)

// WantsJSON reports whether the request asks for JSON: ?format=json, or
// an Accept header that names application/json and not text/html.
func WantsJSON(r *http.Request) bool {
	accept := r.Header.Get("Accept")
	return r.URL.Query().Get("format") == "json" ||
		(strings.Contains(accept, "application/json") && !strings.Contains(accept, "text/html"))
}

// Serve writes doc as indented JSON or through the HTML template.
func Serve(w http.ResponseWriter, r *http.Request, doc any, html *template.Template) {
	if WantsJSON(r) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(doc)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	html.Execute(w, doc)
}
