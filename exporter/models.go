package exporter

import (
	"sync"

	"github.com/tokentap/tokentap/internal/safe"
)

// Label values for model names that are not their own series.
const (
	ModelOther   = "_other"
	ModelUnknown = "_unknown"
)

// maxModelLabelBytes bounds a model label value; a longer name is never
// its own series.
const maxModelLabelBytes = 128

// ModelLabels bounds the cardinality of the model label
// (docs/metrics.md, gen_ai_request_model). A model name gets its own
// label value when:
//
//   - it is declared in the configuration (always), or
//   - it is on the engine's own list (GET /v1/models, refreshed: SetListed), or
//   - the engine served it: a response proved it real (Admit), up to max
//     such names, first come.
//
// Every other name is "_other". A name that has its own label value is
// written by safe.String: valid UTF-8, at most safe.MaxBytes, control
// characters and U+2028/U+2029 escaped (a label value reaches every
// scraper and dashboard as it is). Two names that differ only in what
// was replaced share a series. A client cannot take a slot with a name
// the engine rejects (a 404 for an unknown model, as vLLM, SGLang, TGI and
// Ollama answer), and names the engine lists or the operator declares
// never become "_other", however many others clients invent. Behind an
// engine that accepts any name (llama.cpp's server ignores it), served
// names can still take the max slots; listed ones keep theirs.
//
// It is safe for concurrent use; it is consulted once or twice per
// request, never per token.
type ModelLabels struct {
	mu       sync.RWMutex
	max      int
	declared map[string]struct{}
	listed   map[string]struct{}
	admitted map[string]struct{}
}

// NewModelLabels returns a bound of max served names (0 means 20) on top
// of the declared ones.
func NewModelLabels(max int, declared []string) *ModelLabels {
	if max <= 0 {
		max = 20
	}
	l := &ModelLabels{max: max, declared: map[string]struct{}{}, listed: map[string]struct{}{}, admitted: map[string]struct{}{}}
	for _, d := range declared {
		l.declared[d] = struct{}{}
	}
	return l
}

// known reports whether model has its own label; l.mu must be held.
func (l *ModelLabels) known(model string) bool {
	_, d := l.declared[model]
	_, s := l.listed[model]
	_, a := l.admitted[model]
	return d || s || a
}

// Label returns the label value of a model name without admitting it.
func (l *ModelLabels) Label(model string) string {
	if model == "" {
		return ModelUnknown
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.known(model) {
		return safe.String(model, 0)
	}
	return ModelOther
}

// Admit returns the label value of a model name that the engine has just
// served, admitting it while there is room.
func (l *ModelLabels) Admit(model string) string {
	if model == "" {
		return ModelUnknown
	}
	if lab := l.Label(model); lab != ModelOther {
		return lab
	}
	if len(model) > maxModelLabelBytes {
		return ModelOther
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.known(model) {
		if len(l.admitted) >= l.max {
			return ModelOther
		}
		l.admitted[model] = struct{}{}
	}
	return safe.String(model, 0)
}

// SetListed replaces the engine's list of model names; names longer than
// the label bound are left out, and at most 4×max are kept.
func (l *ModelLabels) SetListed(names []string) {
	m := make(map[string]struct{}, len(names))
	for _, n := range names {
		if n != "" && len(n) <= maxModelLabelBytes && len(m) < 4*l.max {
			m[n] = struct{}{}
		}
	}
	l.mu.Lock()
	l.listed = m
	l.mu.Unlock()
}

// Models returns the model-label bound, shared with every backend.
func (m *Metrics) Models() *ModelLabels { return m.models }
