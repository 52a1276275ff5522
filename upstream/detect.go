package upstream

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokentap/tokentap/engine"
)

// newInfo is tokentap_upstream_info{engine,version} = 1: one series,
// replaced when the engine is known; nil reg: not registered.
func newInfo(reg prometheus.Registerer) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tokentap_upstream_info",
		Help: "The engine in front of which the sidecar runs, as detected at startup (engine kind and version); always 1."},
		[]string{"engine", "version"})
	if reg != nil {
		reg.MustRegister(g)
	}
	g.WithLabelValues(engine.Unknown.Label(), "").Set(1)
	return g
}

func (u *Upstream) setInfo(kind, version string) {
	u.info.Reset()
	u.info.WithLabelValues(boundLabel(kind), boundLabel(version)).Set(1)
}

// boundLabel keeps a label value from the engine short and printable.
func boundLabel(s string) string {
	var b strings.Builder
	for _, c := range s {
		if b.Len() >= 64 {
			break
		}
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.ContainsRune(".-_+:", c):
			b.WriteRune(c)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// fixKind uses the configured engine kind, when there is one, without
// asking; it reports whether there was.
func (u *Upstream) fixKind(setEngine func(string)) bool {
	if u.fixed == "" {
		return false
	}
	u.setInfo(u.fixed, "")
	setEngine(u.fixed)
	u.log.Info("engine", "kind", u.fixed, "how", "engine.kind")
	return true
}

// detect asks the engine what it is (engine.Identify), exports it, logs
// it and tells setEngine the kind; it reports false when the engine
// answered none of the questions (it is not up yet: ask again later).
func (u *Upstream) detect(r *round, setEngine func(string)) bool {
	id, reached := engine.Identify(func(path string) (int, []byte, error) {
		a := r.get(path, detectTimeout, jsonBody)
		return a.status, a.body, a.err
	})
	if !reached {
		return false
	}
	u.setInfo(id.Kind.Label(), id.Version)
	if id.Kind == engine.Unknown {
		u.log.Info("engine not recognised (none of /api/version, /info, /props, /v1/models owned_by told); routes are read by their paths alone")
		return true
	}
	setEngine(string(id.Kind))
	u.log.Info("engine detected", "kind", string(id.Kind), "version", id.Version, "how", id.How)
	return true
}
