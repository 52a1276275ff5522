package gpu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tokentap/tokentap/config"
)

// The dcgm-exporter series the DCGM source reads (the exporter's default
// counters; docs/energy.md, "DCGM exporter").
const (
	dcgmEnergy   = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" // mJ since boot, counter
	dcgmPower    = "DCGM_FI_DEV_POWER_USAGE"              // W
	dcgmUtil     = "DCGM_FI_DEV_GPU_UTIL"                 // %
	dcgmFBUsed   = "DCGM_FI_DEV_FB_USED"                  // MiB
	dcgmSMClock  = "DCGM_FI_DEV_SM_CLOCK"                 // MHz
	dcgmMemClock = "DCGM_FI_DEV_MEM_CLOCK"                // MHz
	dcgmTemp     = "DCGM_FI_DEV_GPU_TEMP"                 // °C
)

// DCGMPort is dcgm-exporter's default port.
const DCGMPort = 9400

// ErrNoDCGM is wrapped by OpenDCGM's error when the exporter cannot be
// used: no URL, unreachable, or none of this pod's GPUs in it.
var ErrNoDCGM = errors.New("DCGM exporter is not available")

// DCGMTarget is the exporter to scrape and how to pick this pod's GPUs
// in it: by Selection (indices or UUIDs, as Selection returns) when
// non-nil, else by the Pod and Namespace labels (an empty Namespace
// matches any).
type DCGMTarget struct {
	URL            string
	Pod, Namespace string
	Selection      []string
}

// ResolveDCGM fills what c leaves empty from the environment the chart
// sets through the downward API: the URL from TOKENTAP_DCGM_URL, else
// http://$NODE_IP:9400/metrics; the pod and namespace from POD_NAME and
// POD_NAMESPACE. sel is Selection's list; its "none" (a sidecar that
// sees no GPU itself, the case DCGM is for) is passed as nil: select by
// pod. ok is false when there is no URL to be had.
func ResolveDCGM(c config.DCGM, sel []string, getenv func(string) string) (t DCGMTarget, ok bool) {
	t = DCGMTarget{URL: c.URL, Pod: c.Pod, Namespace: c.Namespace, Selection: sel}
	if t.URL == "" {
		t.URL = getenv("TOKENTAP_DCGM_URL")
	}
	if ip := getenv("NODE_IP"); t.URL == "" && ip != "" {
		t.URL = "http://" + hostPort(ip) + "/metrics"
	}
	if t.Pod == "" {
		t.Pod = getenv("POD_NAME")
	}
	if t.Namespace == "" {
		t.Namespace = getenv("POD_NAMESPACE")
	}
	return t, t.URL != ""
}

func hostPort(ip string) string {
	for _, c := range ip {
		if c == ':' { // IPv6
			return "[" + ip + "]:" + strconv.Itoa(DCGMPort)
		}
	}
	return ip + ":" + strconv.Itoa(DCGMPort)
}

// Faults logs each kind of energy-source fault once, with its reason,
// and counts every occurrence in tokentap_gpu_source_errors_total{reason}.
// Reasons: energy_off, dcgm_unreachable, gpu_missing, counter_reset.
// A nil *Faults counts and logs nothing.
type Faults struct {
	log    *slog.Logger
	errs   *prometheus.CounterVec
	mu     sync.Mutex
	logged map[string]bool
}

// NewFaults registers the counter with reg (nil: none); log nil means
// slog.Default().
func NewFaults(reg prometheus.Registerer, log *slog.Logger) *Faults {
	if log == nil {
		log = slog.Default()
	}
	f := &Faults{log: log, logged: map[string]bool{},
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokentap_gpu_source_errors_total",
			Help: "Energy source faults by reason (energy_off, dcgm_unreachable, gpu_missing, counter_reset); each reason is logged once."}, []string{"reason"})}
	if reg != nil {
		reg.MustRegister(f.errs)
	}
	return f
}

// Count counts a fault its caller has logged itself: Report will not
// log that reason again.
func (f *Faults) Count(reason string) {
	if f == nil {
		return
	}
	f.errs.WithLabelValues(reason).Inc()
	f.mu.Lock()
	f.logged[reason] = true
	f.mu.Unlock()
}

// Report counts one fault, and logs it the first time its reason occurs.
func (f *Faults) Report(reason string, err error) {
	if f == nil {
		return
	}
	f.errs.WithLabelValues(reason).Inc()
	f.mu.Lock()
	first := !f.logged[reason]
	f.logged[reason] = true
	f.mu.Unlock()
	if first {
		f.log.Warn("energy source fault (logged once per reason, counted in tokentap_gpu_source_errors_total); the sidecar runs on", "reason", reason, "err", err)
	}
}

type dcgmSource struct {
	t      DCGMTarget
	client *http.Client
	faults *Faults
	infos  []DeviceInfo

	// last scrape, keyed by UUID; set by Read(0). prevMJ is each GPU's
	// last energy counter, for the counter-reset report.
	cur    map[string]Reading
	err    error
	prevMJ map[string]uint64
}

// OpenDCGM scrapes the exporter once and selects this pod's GPUs in it.
// timeout bounds each scrape (0: 5 s). Faults (nil: none) receives the
// faults of later scrapes. Read(0) scrapes; Read(i>0) reads the same
// scrape, as the sampler reads device 0 first on every tick.
func OpenDCGM(ctx context.Context, t DCGMTarget, timeout time.Duration, faults *Faults) (Source, error) {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	s := &dcgmSource{t: t, client: &http.Client{Timeout: timeout}, faults: faults, prevMJ: map[string]uint64{}}
	if t.URL == "" {
		return nil, fmt.Errorf("%w: no exporter URL (energy.dcgm.url, TOKENTAP_DCGM_URL or NODE_IP)", ErrNoDCGM)
	}
	fams, err := s.scrape(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDCGM, err)
	}
	if t.Selection == nil && t.Pod == "" {
		return nil, fmt.Errorf("%w: no pod to select GPUs by (energy.dcgm.pod or POD_NAME) and no device list", ErrNoDCGM)
	}
	seen := map[string]bool{}
	for _, m := range fams[dcgmEnergy].GetMetric() {
		l := labels(m)
		uuid := l["UUID"]
		if uuid == "" || seen[uuid] || !s.mine(l) {
			continue
		}
		seen[uuid] = true // one entry per physical GPU (MIG instances repeat it)
		idx, _ := strconv.Atoi(l["gpu"])
		s.infos = append(s.infos, DeviceInfo{Index: idx, UUID: uuid, Name: l["modelName"]})
	}
	s.cur = readings(fams)
	return s, nil
}

// mine reports whether a series' GPU is this pod's.
func (s *dcgmSource) mine(l map[string]string) bool {
	if s.t.Selection != nil {
		return selected(s.t.Selection, l["gpu"], l["UUID"])
	}
	return l["pod"] == s.t.Pod && (s.t.Namespace == "" || l["namespace"] == s.t.Namespace)
}

func (s *dcgmSource) scrape(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.t.URL, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", s.t.URL, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %v", s.t.URL, err)
	}
	return fams, nil
}

func labels(m *dto.Metric) map[string]string {
	l := make(map[string]string, len(m.GetLabel()))
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

// readings turns a scrape into one Reading per GPU UUID.
func readings(fams map[string]*dto.MetricFamily) map[string]Reading {
	out := map[string]Reading{}
	each := func(name string, set func(r *Reading, v float64)) {
		for _, m := range fams[name].GetMetric() {
			uuid := labels(m)["UUID"]
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
			if uuid == "" || math.IsNaN(v) || v < 0 {
				continue
			}
			r := out[uuid]
			set(&r, v)
			out[uuid] = r
		}
	}
	each(dcgmEnergy, func(r *Reading, v float64) { r.EnergyMJ, r.HasEnergy = uint64(v), true })
	each(dcgmPower, func(r *Reading, v float64) { r.PowerMW, r.HasPower = uint32(math.Round(v*1e3)), true })
	each(dcgmUtil, func(r *Reading, v float64) { r.UtilGPU = uint32(v) })
	each(dcgmFBUsed, func(r *Reading, v float64) { r.MemUsed = uint64(v) << 20 })
	each(dcgmSMClock, func(r *Reading, v float64) { r.SMClockMHz = uint32(v) })
	each(dcgmMemClock, func(r *Reading, v float64) { r.MemClockMHz = uint32(v) })
	each(dcgmTemp, func(r *Reading, v float64) { r.TempC = uint32(v) })
	return out
}

func (s *dcgmSource) Devices() []DeviceInfo { return s.infos }

// Origin names the source in the record's energy_source (dcgm_counter…).
func (s *dcgmSource) Origin() string { return "dcgm" }

func (s *dcgmSource) Close() error { s.client.CloseIdleConnections(); return nil }

// Read returns GPU i from the latest scrape; Read(0) scrapes first. An
// unreachable exporter fails every GPU's read; a GPU missing from the
// exposition fails its own. Both, and a counter that went down (a node
// reboot), are reported to the Faults.
func (s *dcgmSource) Read(i int) (Reading, error) {
	d := s.infos[i]
	if i == 0 {
		fams, err := s.scrape(context.Background())
		s.cur, s.err = nil, err
		if err != nil {
			s.faults.Report("dcgm_unreachable", err)
		} else {
			s.cur = readings(fams)
		}
	}
	if s.err != nil {
		return Reading{}, fmt.Errorf("gpu %d (%s): %w", d.Index, d.UUID, s.err)
	}
	r, ok := s.cur[d.UUID]
	if !ok || (!r.HasEnergy && !r.HasPower) {
		err := fmt.Errorf("gpu %d (%s): not in the exposition of %s", d.Index, d.UUID, s.t.URL)
		s.faults.Report("gpu_missing", err)
		return Reading{}, err
	}
	if prev, had := s.prevMJ[d.UUID]; had && r.HasEnergy && r.EnergyMJ < prev {
		s.faults.Report("counter_reset", fmt.Errorf("gpu %d (%s): energy counter went from %d to %d mJ (node reboot or driver reload); this interval integrates power", d.Index, d.UUID, prev, r.EnergyMJ))
	}
	if r.HasEnergy {
		s.prevMJ[d.UUID] = r.EnergyMJ
	}
	return r, nil
}
