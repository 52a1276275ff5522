package probe

import (
	"encoding/json"
	"html/template"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/tokentap/tokentap/internal/page"
	"github.com/tokentap/tokentap/record"
)

// Page is the /probes document.
type Page struct {
	Generated time.Time `json:"generated"`
	// Synthetic says what on the page is made up (Options.Synthetic);
	// absent when nothing is.
	Synthetic string        `json:"synthetic,omitempty"`
	Probes    []ProbeStatus `json:"probes"`
}

// ProbeStatus is one probe's definition summary and history.
type ProbeStatus struct {
	Name                string   `json:"name"`
	API                 string   `json:"api"`
	Target              string   `json:"target"`
	Schedule            string   `json:"schedule"`
	IntervalSeconds     float64  `json:"interval_seconds"`
	ConsecutiveFailures int      `json:"consecutive_failures"`
	Recent              []Result `json:"recent"`
	Failures            []Result `json:"failures"` // kept longer than Recent
	LastFailure         *Result  `json:"last_failure"`
}

// Status builds the /probes document; newest results first.
func (p *Prober) Status() Page {
	pg := Page{Generated: time.Now().UTC(), Synthetic: p.opts.Synthetic, Probes: []ProbeStatus{}}
	for _, s := range p.defs {
		s.mu.Lock()
		st := ProbeStatus{Name: s.def.Name, API: s.def.API, Target: s.def.Target, Schedule: s.def.Schedule,
			IntervalSeconds: s.def.Interval.Seconds(), ConsecutiveFailures: s.fails,
			Recent: reversed(s.recent), Failures: reversed(s.failures)}
		s.mu.Unlock()
		if len(st.Failures) > 0 {
			st.LastFailure = &st.Failures[0]
		}
		pg.Probes = append(pg.Probes, st)
	}
	sort.Slice(pg.Probes, func(i, j int) bool { return pg.Probes[i].Name < pg.Probes[j].Name })
	return pg
}

func reversed(l []Result) []Result {
	out := make([]Result, len(l))
	for i, r := range l {
		out[len(l)-1-i] = r
	}
	return out
}

var pageTmpl = template.Must(template.New("probes").Funcs(template.FuncMap{
	"ms": func(f *float64) string {
		if f == nil {
			return "–"
		}
		return fmtF(*f)
	},
	"count": func(n *int64) string {
		if n == nil {
			return "–"
		}
		return strconv.FormatInt(*n, 10)
	},
	"conn": func(u *record.Upstream) string {
		switch {
		case u == nil || u.Known&record.UpConnWait == 0:
			return "–"
		case u.Reused:
			return "reused"
		}
		return "new"
	},
	"phaseNames": func() []string {
		names := make([]string, len(record.UpstreamPhases))
		for i, p := range record.UpstreamPhases {
			names[i] = p.Name
		}
		return names
	},
	"phase": func(u *record.Upstream, name string) string {
		for _, p := range record.UpstreamPhases {
			if u == nil || p.Name != name {
				continue
			}
			if d, ok := u.Phase(p.Bit); ok {
				return fmtF(msf(d))
			}
		}
		return "–"
	},
}).Parse(`<!doctype html><html><head><meta charset="utf-8"><title>tokentap probes</title>
<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:2em}td,th{border:1px solid #ccc;padding:3px 6px}th{background:#eee}.failed,.not_sent{color:#b00}.success{color:#070}.synthetic{background:#fff3b0;border:2px solid #d9a400;padding:.5em 1em;font-weight:bold}</style><link rel="icon" href="data:,"></head><body>
{{if .Synthetic}}<div class="synthetic" id="synthetic">SYNTHETIC: {{.Synthetic}}</div>{{end}}
<h1>Canary probes</h1><p><a href="/">index</a> · <a href="/live">live</a> · <a href="/slo">/slo</a></p><p>Generated {{.Generated.Format "2006-01-02T15:04:05Z07:00"}}. <a href="?format=json">JSON</a></p>
{{range .Probes}}<h2>{{.Name}}</h2><p>{{.API}} → {{.Target}}, {{.Schedule}} every {{.IntervalSeconds}} s; {{.ConsecutiveFailures}} failures in a row.
{{with .LastFailure}}Last failure: {{.Scheduled.Format "15:04:05"}} HTTP {{.HTTPStatus}} {{.Failure}} {{.Detail}}{{end}}</p>
<table><tr><th>scheduled</th><th>lag ms</th><th>result</th><th>outcome</th><th>HTTP</th><th>TTFT ms</th><th>E2E ms</th><th>tokens</th><th>failure</th><th>conn</th><th>conn wait ms</th><th>DNS ms</th><th>connect ms</th><th>TLS ms</th><th>server ms</th></tr>
{{range .Recent}}<tr><td>{{.Scheduled.Format "15:04:05.000"}}</td><td>{{.LagMS}}</td><td class="{{.Result}}">{{.Result}}</td><td>{{.Outcome}}</td><td>{{.HTTPStatus}}</td><td>{{ms .TTFTMS}}</td><td>{{ms .E2EMS}}</td><td>{{count .OutputTokens}}</td><td>{{.Failure}}</td><td>{{conn .Upstream}}</td>{{$u := .Upstream}}{{range $p := phaseNames}}<td>{{phase $u $p}}</td>{{end}}</tr>{{end}}
</table>{{end}}</body></html>`))

// fmtF writes a number of milliseconds as JSON would: the shortest form
// that reads back the same (240, 1.5), never a trailing zero to trim.
func fmtF(f float64) string { b, _ := json.Marshal(f); return string(b) }

// ServeHTTP serves /probes: HTML, or JSON with ?format=json or an Accept
// header preferring application/json.
func (p *Prober) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	page.Serve(w, r, p.Status(), pageTmpl)
}
