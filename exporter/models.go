package exporter

import "sync"

// Label values for model names that are not their own series.
const (
	ModelOther   = "_other"
	ModelUnknown = "_unknown"
)

// ModelLabels bounds the cardinality of the model label: the declared
// models and the first max distinct other names seen keep their name;
// every later name is exported as "_other". A client cannot explode the
// number of series by inventing model names.
//
// It is safe for concurrent use; it is consulted once per request.
type ModelLabels struct {
	mu   sync.RWMutex
	max  int
	seen map[string]struct{}
	n    int // names admitted beyond the declared ones
}

// NewModelLabels returns a bound of max names (0 means 20) on top of the
// declared ones.
func NewModelLabels(max int, declared []string) *ModelLabels {
	if max <= 0 {
		max = 20
	}
	l := &ModelLabels{max: max, seen: make(map[string]struct{}, max+len(declared))}
	for _, d := range declared {
		l.seen[d] = struct{}{}
	}
	return l
}

// Label returns the label value for a model name.
func (l *ModelLabels) Label(model string) string {
	if model == "" {
		return ModelUnknown
	}
	l.mu.RLock()
	_, ok := l.seen[model]
	l.mu.RUnlock()
	if ok {
		return model
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[model]; ok {
		return model
	}
	if l.n >= l.max || len(model) > 128 {
		return ModelOther
	}
	l.seen[model] = struct{}{}
	l.n++
	return model
}

// Models returns the model-label bound, shared with every backend.
func (m *Metrics) Models() *ModelLabels { return m.models }
