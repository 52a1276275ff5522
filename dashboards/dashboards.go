// Package dashboards defines tokentap's Grafana dashboards as Go code, with
// the Grafana Foundation SDK, and renders them to the JSON files that ship
// in this folder (the Helm chart links to them). Regenerate them from the
// repository root with
//
//	go run ./dashboards/gen
//
// A test regenerates them and compares byte for byte; another runs every
// panel query against a real Prometheus that scrapes a real sidecar.
//
// Every query of a sidecar's series selects it by scrape job and instance
// (job=~"$job", instance=~"$instance", All being .+: Prometheus gives
// every scraped series both labels) and by the Kubernetes labels with
// matchers that also match series without them (namespace=~"$namespace"
// with an All value of .*), so the same dashboards work on a laptop (no
// namespace, no pod) and in Kubernetes. The fleet's recording rules have
// no job or instance: dashboards/.lint lists those queries, each with
// why, for Grafana's dashboard linter (docs/deploy.md). Histogram queries
// read native histograms where the Prometheus has them and fall back to
// classic buckets otherwise (see hq).
package dashboards

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/bargauge"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/heatmap"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// Label matchers shared by every query of a sidecar's series. job and
// instance are on every scraped series (All is .+); each of the others
// works when its label is absent: an absent label is the empty string,
// which .* matches.
const (
	// sel picks the sidecars: the scrape job, the Kubernetes namespace
	// and pod (added by Prometheus' Kubernetes service discovery) and the
	// scrape instance.
	sel = `job=~"$job", namespace=~"$namespace", pod=~"$pod", instance=~"$instance"`
	// selM adds the model label of the request-level series.
	selM = sel + `, gen_ai_request_model=~"$model"`
	// selT adds the traffic class (live or canary).
	selT = selM + `, traffic=~"$traffic"`
	// selLive is live traffic of the selected models.
	selLive = selM + `, traffic="live"`
	// selSLO picks the SLO series of the selected sidecars.
	selSLO = sel + `, slo=~"$slo"`
	// selProbe picks the canary probes.
	selProbe = sel + `, probe=~"$probe"`
	// selCanary is canary traffic of the selected probes.
	selCanary = sel + `, traffic="canary", probe=~"$probe"`
)

// The rate window Grafana computes from the scrape interval.
const ri = "$__rate_interval"

// target is one query of a panel.
type target struct {
	expr, legend string
	instant      bool
	heatmap      bool // format: heatmap (classic buckets)
}

// panel kinds.
const (
	kTimeseries = "timeseries"
	kStat       = "stat"
	kHeatmap    = "heatmap"
	kBarGauge   = "bargauge"
)

// panel is one panel of a dashboard.
type panel struct {
	kind        string
	title, desc string
	unit        string
	w, h        uint32
	min, max    *float64
	stack       bool
	// rightAxis names a legend (by regexp) whose series go on the right
	// axis, with rightUnit as their unit.
	rightAxis, rightUnit string
	// thresholds draws reference lines (timeseries) or colours (stat).
	thresholds []float64
	// noValue is what a stat shows when its queries return nothing.
	noValue string
	// percent names the series (by legend regexp) that a bar gauge shows
	// as a ratio from 0 to 1 (percentunit); its other series keep unit
	// and share one scale.
	percent string
	targets []target
}

// row starts a new row of panels.
type row struct {
	title  string
	panels []panel
}

// board is one dashboard.
type board struct {
	file, uid, title, desc string
	tags                   []string
	vars                   []string // variables beyond datasource, job, namespace, pod, instance
	rows                   []row
}

func fp(v float64) *float64 { return &v }

// hq is a quantile of a histogram that works on both kinds of storage:
// the native histogram where Prometheus ingests it (scraped in protobuf
// with native histograms on), else the classic _bucket series. The two
// sides have the same labels, so `or` picks the native side per series
// and falls back to the classic one where the native is absent.
func hq(q string, metric, matchers, by string) string {
	return fmt.Sprintf(`histogram_quantile(%s, sum by (%s) (rate(%s{%s}[%s]))) or histogram_quantile(%s, sum by (%s) (rate(%s_bucket{%s}[%s])))`,
		q, by, metric, matchers, ri, q, join(by, "le"), metric, matchers, ri)
}

// hcount is the per-second rate of observations of a histogram (native
// or classic).
func hcount(metric, matchers, by string) string {
	return fmt.Sprintf(`sum by (%s) (histogram_count(rate(%s{%s}[%s]))) or sum by (%s) (rate(%s_count{%s}[%s]))`,
		by, metric, matchers, ri, by, metric, matchers, ri)
}

// hsum is the per-second rate of the sum of a histogram's observations
// (native or classic).
func hsum(metric, matchers, by string) string {
	return fmt.Sprintf(`sum by (%s) (histogram_sum(rate(%s{%s}[%s]))) or sum by (%s) (rate(%s_sum{%s}[%s]))`,
		by, metric, matchers, ri, by, metric, matchers, ri)
}

// hmap is the distribution of a histogram for a heatmap panel: the
// native histogram where it exists, the classic buckets (by le) only
// where it does not (`unless on ()` drops them when any native series
// answered, so a Prometheus that keeps both never shows both).
func hmap(metric, matchers string) string {
	native := fmt.Sprintf(`sum(increase(%s{%s}[%s]))`, metric, matchers, ri)
	return fmt.Sprintf(`%s or (sum by (le) (increase(%s_bucket{%s}[%s])) unless on () %s)`, native, metric, matchers, ri, native)
}

func join(by, extra string) string {
	if strings.TrimSpace(by) == "" {
		return extra
	}
	return by + ", " + extra
}

// quantiles gives one target per quantile (p50, p90, p99 by default),
// legend "<prefix>p50" etc.
func quantiles(metric, matchers, by, legendPrefix string, qs ...string) []target {
	if len(qs) == 0 {
		qs = []string{"0.5", "0.9", "0.99"}
	}
	var out []target
	for _, q := range qs {
		name := "p" + strings.TrimPrefix(q, "0.")
		if len(name) == 2 { // 0.5 → p5 → p50
			name += "0"
		}
		out = append(out, target{expr: hq(q, metric, matchers, by), legend: legendPrefix + name})
	}
	return out
}

var dsRef = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

func (t target) builder(ref string) *prometheus.DataqueryBuilder {
	b := prometheus.NewDataqueryBuilder().Datasource(dsRef).RefId(ref).Expr(t.expr)
	if t.legend != "" {
		b = b.LegendFormat(t.legend)
	} else {
		b = b.LegendFormat("__auto")
	}
	if t.instant {
		b = b.Instant().Format(prometheus.PromQueryFormatTable)
	} else {
		b = b.Range()
	}
	if t.heatmap {
		b = b.Format(prometheus.PromQueryFormatHeatmap)
	}
	return b
}

func refID(i int) string { return string(rune('A' + i)) }

func thresholdSteps(ts []float64) *dashboard.ThresholdsConfigBuilder {
	steps := []dashboard.Threshold{{Value: nil, Color: "green"}}
	colors := []string{"orange", "red", "dark-red"}
	for i, v := range ts {
		steps = append(steps, dashboard.Threshold{Value: cog.ToPtr(v), Color: colors[min(i, len(colors)-1)]})
	}
	return dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps(steps)
}

func (p panel) builder() (cog.Builder[dashboard.Panel], error) {
	w, h := p.w, p.h
	if w == 0 {
		w = 12
	}
	if h == 0 {
		h = 8
	}
	switch p.kind {
	case kTimeseries, "":
		b := timeseries.NewPanelBuilder().Title(p.title).Description(p.desc).Datasource(dsRef).
			Span(w).Height(h).Unit(p.unit).
			Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).DisplayMode(common.LegendDisplayModeTable).
				Placement(common.LegendPlacementBottom).Calcs([]string{"mean", "max", "lastNotNull"})).
			Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending)).
			FillOpacity(10).LineWidth(1).ShowPoints(common.VisibilityModeNever).SpanNulls(common.BoolOrFloat64{Bool: cog.ToPtr(false)})
		if p.min != nil {
			b = b.Min(*p.min)
		}
		if p.max != nil {
			b = b.Max(*p.max)
		}
		if p.stack {
			b = b.Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal)).FillOpacity(60)
		}
		if len(p.thresholds) > 0 {
			b = b.Thresholds(thresholdSteps(p.thresholds)).
				ThresholdsStyle(common.NewGraphThresholdsStyleConfigBuilder().Mode(common.GraphThresholdsStyleModeDashed))
		}
		if p.rightAxis != "" {
			b = b.OverrideByRegexp(p.rightAxis, []dashboard.DynamicConfigValue{
				{Id: "custom.axisPlacement", Value: "right"},
				{Id: "unit", Value: p.rightUnit},
				{Id: "custom.drawStyle", Value: "bars"},
				{Id: "custom.fillOpacity", Value: 40},
			})
		}
		for i, t := range p.targets {
			b = b.WithTarget(t.builder(refID(i)))
		}
		return b, nil
	case kStat:
		b := stat.NewPanelBuilder().Title(p.title).Description(p.desc).Datasource(dsRef).
			Span(w).Height(h).Unit(p.unit).
			GraphMode(common.BigValueGraphModeArea).ColorMode(common.BigValueColorModeValue).
			ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Values(false))
		if p.min != nil {
			b = b.Min(*p.min)
		}
		if p.max != nil {
			b = b.Max(*p.max)
		}
		if len(p.thresholds) > 0 {
			b = b.Thresholds(thresholdSteps(p.thresholds))
		}
		if p.noValue != "" {
			b = b.NoValue(p.noValue)
		}
		for i, t := range p.targets {
			b = b.WithTarget(t.builder(refID(i)))
		}
		return b, nil
	case kBarGauge:
		b := bargauge.NewPanelBuilder().Title(p.title).Description(p.desc).Datasource(dsRef).
			Span(w).Height(h).Unit(p.unit).Orientation(common.VizOrientationHorizontal).
			DisplayMode(common.BarGaugeDisplayModeBasic).
			ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Values(false))
		if p.min != nil {
			b = b.Min(*p.min)
		}
		if p.max != nil {
			b = b.Max(*p.max)
		}
		if p.percent != "" {
			b = b.OverrideByRegexp(p.percent, []dashboard.DynamicConfigValue{
				{Id: "unit", Value: "percentunit"},
				{Id: "min", Value: 0},
				{Id: "max", Value: 1},
			})
		}
		for i, t := range p.targets {
			b = b.WithTarget(t.builder(refID(i)))
		}
		return b, nil
	case kHeatmap:
		b := heatmap.NewPanelBuilder().Title(p.title).Description(p.desc).Datasource(dsRef).
			Span(w).Height(h).Unit(p.unit).Calculate(false).
			Color(heatmap.NewHeatmapColorOptionsBuilder().Mode(heatmap.HeatmapColorModeScheme).Scheme("Oranges").
				Scale(heatmap.HeatmapColorScaleExponential).Exponent(0.5).Steps(64).Fill("dark-orange").Reverse(false)).
			YAxis(heatmap.NewYAxisConfigBuilder().Unit(p.unit).Reverse(false)).
			RowsFrame(heatmap.NewRowsHeatmapOptionsBuilder().Layout(common.HeatmapCellLayoutLe)).
			CellValues(heatmap.NewCellValuesBuilder().Unit("short")).
			ShowValue(common.VisibilityModeNever).
			Tooltip(heatmap.NewHeatmapTooltipBuilder().Mode(common.TooltipDisplayModeSingle).YHistogram(true).ShowColorScale(true)).
			ShowLegend().ExemplarsColor("rgba(255,0,255,0.7)").
			FilterValues(heatmap.NewFilterValueRangeBuilder().Le(1e-9)).
			SelectionMode(heatmap.HeatmapSelectionModeX)
		for i, t := range p.targets {
			t.heatmap = true
			b = b.WithTarget(t.builder(refID(i)))
		}
		return b, nil
	}
	return nil, fmt.Errorf("panel %q: unknown kind %q", p.title, p.kind)
}

// variable builds a template variable by name.
func variable(name string) (cog.Builder[dashboard.VariableModel], error) {
	all := dashboard.VariableOption{Selected: cog.ToPtr(true), Text: dashboard.StringOrArrayOfString{String: cog.ToPtr("All")},
		Value: dashboard.StringOrArrayOfString{String: cog.ToPtr("$__all")}}
	// allValue is what All stands for: .+ for the labels that every
	// scraped series has (job, instance), .* for the others, so that All
	// also matches series without them.
	query := func(label, q, desc, allValue string) cog.Builder[dashboard.VariableModel] {
		return dashboard.NewQueryVariableBuilder(name).Label(label).Description(desc).
			Query(dashboard.StringOrMap{String: cog.ToPtr(q)}).Definition(q).
			Datasource(dsRef).Multi(true).IncludeAll(true).AllValue(allValue).Current(all).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).Sort(dashboard.VariableSortAlphabeticalAsc)
	}
	switch name {
	case "datasource":
		return dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus").
			Description("The Prometheus that scrapes the tokentap sidecars."), nil
	case "job":
		return query("Job", `label_values(tokentap_connections_max, job)`,
			"Scrape job of the sidecars (the job_name of Prometheus' scrape configuration, or the ServiceMonitor's). All (.+) matches every job.", ".+"), nil
	case "namespace":
		return query("Namespace", `label_values(tokentap_connections_max{job=~"$job"}, namespace)`,
			"Kubernetes namespace of the sidecars (added by Prometheus' Kubernetes discovery). All (.*) also matches series without the label.", ".*"), nil
	case "pod":
		return query("Pod", `label_values(tokentap_connections_max{job=~"$job", namespace=~"$namespace"}, pod)`,
			"Pod of the sidecars. All (.*) also matches series without the label.", ".*"), nil
	case "instance":
		return query("Instance", `label_values(tokentap_connections_max{job=~"$job", namespace=~"$namespace", pod=~"$pod"}, instance)`,
			"Scrape target (the sidecar's admin address). All (.+) matches every sidecar.", ".+"), nil
	case "model":
		return query("Model", `label_values(tokentap_requests_total{`+sel+`}, gen_ai_request_model)`,
			"gen_ai_request_model: the model the client asked for, bounded by the sidecar (docs/metrics.md, common labels).", ".*"), nil
	case "slo":
		return query("SLO", `label_values(tokentap_slo_target{`+sel+`}, slo)`,
			"The SLOs declared in the sidecars' configuration (docs/slo.md).", ".*"), nil
	case "tenant":
		return query("Tenant", `label_values(tokentap_slo_requests_by_tenant_total{`+sel+`}, tenant)`,
			"The bounded tenant label (docs/metrics.md, per tenant; docs/config.md, tenant): a declared name, t- and 12 hex characters of a keyed hash, _other, _none. Empty unless the sidecars resolve tenants.", ".*"), nil
	case "probe":
		return query("Probe", `label_values(tokentap_probe_scheduled_total{`+sel+`}, probe)`,
			"Canary probes by name (docs/probe.md).", ".*"), nil
	case "traffic":
		live := dashboard.VariableOption{Selected: cog.ToPtr(true), Text: dashboard.StringOrArrayOfString{String: cog.ToPtr("live")},
			Value: dashboard.StringOrArrayOfString{String: cog.ToPtr("live")}}
		return dashboard.NewCustomVariableBuilder("traffic").Label("Traffic").
			Description("live: proxied client traffic; canary: the probe's requests (docs/metrics.md, common labels).").
			Values(dashboard.StringOrMap{String: cog.ToPtr("live,canary")}).Multi(true).IncludeAll(true).AllValue(".*").
			Current(live).Options([]dashboard.VariableOption{live,
			{Selected: cog.ToPtr(false), Text: dashboard.StringOrArrayOfString{String: cog.ToPtr("canary")}, Value: dashboard.StringOrArrayOfString{String: cog.ToPtr("canary")}}}), nil
	}
	return nil, fmt.Errorf("unknown variable %q", name)
}

// build returns the dashboard as the SDK's v1 model (a dashboard.Dashboard).
func (d board) build() (any, error) {
	//lint:ignore SA1019 the v1 JSON model is what Grafana's file provisioning and its sidecar loader read; dashboardv2 needs Grafana 12's v2 API
	// Read-only: provisioned dashboards are regenerated from this code, so
	// an edit in Grafana's UI would be lost (and Grafana's linter asks for
	// editable: false).
	b := dashboard.NewDashboardBuilder(d.title).Uid(d.uid).Description(d.desc).Tags(d.tags).
		Readonly().Tooltip(dashboard.DashboardCursorSyncCrosshair).Refresh("30s").Time("now-1h", "now").
		Timezone(common.TimeZoneBrowser).
		Link(dashboard.NewDashboardLinkBuilder("tokentap").Type(dashboard.DashboardLinkTypeDashboards).
			Tags([]string{"tokentap"}).AsDropdown(true).IncludeVars(true).KeepTime(true).TargetBlank(false).Icon("external link").Tooltip(""))
	for _, v := range append([]string{"datasource", "job", "namespace", "pod", "instance"}, d.vars...) {
		vb, err := variable(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", d.file, err)
		}
		b = b.WithVariable(vb)
	}
	for _, r := range d.rows {
		b = b.WithRow(dashboard.NewRowBuilder(r.title))
		for _, p := range r.panels {
			pb, err := p.builder()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", d.file, err)
			}
			b = b.WithPanel(pb)
		}
	}
	db, err := b.Build()
	return db, err
}

// Render returns every dashboard's JSON by file name (tokentap-*.json).
func Render() (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, d := range boards() {
		db, err := d.build()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", d.file, err)
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if err := enc.Encode(db); err != nil {
			return nil, fmt.Errorf("%s: %w", d.file, err)
		}
		out[d.file] = buf.Bytes()
	}
	return out, nil
}

// Files lists the dashboard file names in a fixed order.
func Files() []string {
	var names []string
	for _, d := range boards() {
		names = append(names, d.file)
	}
	sort.Strings(names)
	return names
}

// Dir is where the generated dashboards go, relative to the repository
// root. The Helm chart reads them through a link
// (deploy/helm/tokentap/dashboards → dashboards).
const Dir = "dashboards"

// Generated returns every file that `go run ./dashboards/gen` writes, by
// path under root (the repository root): the dashboards and LintFile.
func Generated(root string) (map[string][]byte, error) {
	r, err := Render()
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for name, b := range r {
		out[filepath.Join(root, Dir, name)] = b
	}
	lint, err := LintConfig()
	if err != nil {
		return nil, err
	}
	out[filepath.Join(root, Dir, LintFile)] = lint
	return out, nil
}
