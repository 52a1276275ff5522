package gpu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
	// MaxBytes bounds one page; 0 means DefaultDCGMMaxBytes.
	MaxBytes int64
}

// ResolveDCGM fills what c leaves empty from the environment the chart
// sets through the downward API: the URL from TOKENTAP_DCGM_URL, else
// http://$NODE_IP:9400/metrics; the pod and namespace from POD_NAME and
// POD_NAMESPACE. sel is Selection's list; its "none" (a sidecar that
// sees no GPU itself, the case DCGM is for) is passed as nil: select by
// pod. ok is false when there is no URL to be had.
func ResolveDCGM(c config.DCGM, sel []string, getenv func(string) string) (t DCGMTarget, ok bool) {
	t = DCGMTarget{URL: c.URL, Pod: c.Pod, Namespace: c.Namespace, Selection: sel, MaxBytes: c.MaxBytes}
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
// Reasons: energy_off, gpu_missing, counter_reset, the exporter's
// dcgm_unreachable, dcgm_timeout, dcgm_too_large, dcgm_too_many_gpus and
// dcgm_malformed, and the values refused: value_nan, value_inf,
// value_negative, value_out_of_range (docs/metrics.md).
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
			Help: "Energy source faults by reason (energy_off, gpu_missing, counter_reset, dcgm_unreachable, dcgm_timeout, dcgm_too_large, dcgm_too_many_gpus, dcgm_malformed, value_nan, value_inf, value_negative, value_out_of_range); each reason is logged once."}, []string{"reason"})}
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
	ours   map[string]bool // the UUIDs of infos

	// last scrape, keyed by UUID; set by Read(0). refused holds the
	// GPUs whose energy or power value was refused in it, with the
	// reason. prevMJ is each GPU's last energy counter, for the
	// counter-reset report.
	cur     map[string]*Reading
	refused map[string]string
	err     error
	prevMJ  map[string]uint64
}

// OpenDCGM scrapes the exporter once and selects this pod's GPUs in it.
// timeout bounds each scrape, the page read included (0: 5 s); t.MaxBytes
// bounds each page (0: DefaultDCGMMaxBytes). Faults (nil: none) receives
// the faults of later scrapes and the values refused. Read(0) scrapes;
// Read(i>0) reads the same scrape, as the sampler reads device 0 first
// on every tick.
func OpenDCGM(ctx context.Context, t DCGMTarget, timeout time.Duration, faults *Faults) (Source, error) {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	if t.MaxBytes <= 0 {
		t.MaxBytes = DefaultDCGMMaxBytes
	}
	s := &dcgmSource{t: t, client: &http.Client{Timeout: timeout,
		// A redirect is no page: followed, it could take the scrape off
		// the node (docs/measurement.md §3, "Which statuses are answers").
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}, faults: faults, prevMJ: map[string]uint64{}}
	if t.URL == "" {
		return nil, fmt.Errorf("%w: no exporter URL (energy.dcgm.url, TOKENTAP_DCGM_URL or NODE_IP)", ErrNoDCGM)
	}
	if t.Selection == nil && t.Pod == "" {
		return nil, fmt.Errorf("%w: no pod to select GPUs by (energy.dcgm.pod or POD_NAME) and no device list", ErrNoDCGM)
	}
	seen := map[string]bool{}
	sc, err := s.scrape(ctx, s.mine, func(x *pageLine) {
		if x.name != dcgmEnergy || seen[string(x.uuid)] {
			return
		}
		uuid := string(x.uuid)
		seen[uuid] = true // one entry per physical GPU (MIG instances repeat it)
		idx, _ := strconv.Atoi(string(x.gpu))
		s.infos = append(s.infos, DeviceInfo{Index: idx, UUID: uuid, Name: string(x.model)})
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDCGM, err)
	}
	s.ours = seen
	s.cur, s.refused = sc.cur, sc.refused
	return s, nil
}

// mine reports whether a series' GPU is this pod's.
func (s *dcgmSource) mine(x *pageLine) bool {
	if s.t.Selection != nil {
		return selected(s.t.Selection, string(x.gpu), string(x.uuid))
	}
	return string(x.pod) == s.t.Pod && (s.t.Namespace == "" || string(x.namespace) == s.t.Namespace)
}

// scraped is one scrape's readings of the GPUs kept, keyed by UUID, and
// the GPUs of which a value was refused, with the first reason.
type scraped struct {
	cur     map[string]*Reading
	refused map[string]string
}

// Reasons a scrape or a value is refused, counted in
// tokentap_gpu_source_errors_total{reason} (docs/metrics.md).
const (
	reasonUnreachable = "dcgm_unreachable"
	reasonTimeout     = "dcgm_timeout"
	reasonTooLarge    = "dcgm_too_large"
	reasonTooMany     = "dcgm_too_many_gpus"
	reasonMalformed   = "dcgm_malformed"
	reasonNaN         = "value_nan"
	reasonInf         = "value_inf"
	reasonNegative    = "value_negative"
	reasonOutOfRange  = "value_out_of_range"
)

// scrapeError is a scrape's failure with the reason it is counted by.
type scrapeError struct {
	reason string
	err    error
}

func (e *scrapeError) Error() string { return e.err.Error() }
func (e *scrapeError) Unwrap() error { return e.err }

// scrape GETs the page and reads it as it arrives (scanPage: bounded by
// t.MaxBytes and the client's timeout, nothing kept but the series read).
// keep picks the GPUs whose series are read; each (nil: none) sees every
// line kept, before its value is judged. A value that is not finite, is
// negative or does not fit its reading is refused by name, counted and
// logged (once per reason) through the Faults, and its GPU lacks that
// field in this scrape.
func (s *dcgmSource) scrape(ctx context.Context, keep func(*pageLine) bool, each func(*pageLine)) (scraped, error) {
	sc := scraped{cur: map[string]*Reading{}, refused: map[string]string{}}
	fail := func(reason string, err error) (scraped, error) {
		return scraped{}, &scrapeError{reason, fmt.Errorf("GET %s: %w", s.t.URL, err)}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.t.URL, nil)
	if err != nil {
		return fail(reasonUnreachable, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.client.Do(req)
	if err != nil {
		if isTimeout(err) {
			return fail(reasonTimeout, err)
		}
		return fail(reasonUnreachable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fail(reasonUnreachable, errors.New(resp.Status))
	}
	var tooMany error
	err = scanPage(resp.Body, s.t.MaxBytes, func(x *pageLine) {
		if len(x.uuid) == 0 || !keep(x) || tooMany != nil {
			return
		}
		r := sc.cur[string(x.uuid)] // a lookup by the line's bytes: no allocation
		if r == nil {
			if len(sc.cur) >= maxDCGMGPUs {
				tooMany = fmt.Errorf("the page names more than %d GPUs of this pod", maxDCGMGPUs)
				return
			}
			r = new(Reading)
			sc.cur[string(x.uuid)] = r
		}
		if each != nil {
			each(x)
		}
		v, reason := judge(x.name, x.value)
		if reason != "" {
			if _, ok := sc.refused[string(x.uuid)]; !ok {
				sc.refused[string(x.uuid)] = reason
			}
			s.faults.Report(reason, fmt.Errorf("%s of gpu %s (%s) at %s is %q: refused", x.name, x.gpu, x.uuid, s.t.URL, clip(x.value)))
		} else {
			set(r, x.name, v)
		}
	}, func(name string, err error) {
		if name != "" {
			s.faults.Report(reasonMalformed, fmt.Errorf("%s at %s: line refused: %v", name, s.t.URL, err))
		}
	})
	switch {
	case errors.Is(err, errPageTooLarge):
		return fail(reasonTooLarge, err)
	case err != nil && isTimeout(err):
		return fail(reasonTimeout, err)
	case err != nil:
		return fail(reasonUnreachable, err)
	case tooMany != nil:
		return fail(reasonTooMany, tooMany)
	}
	return sc, nil
}

// isTimeout reports whether err is a scrape's timeout (the client's, or
// the context's deadline).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// fieldMax is the largest value a series may hold and fit its Reading
// field (uint64 mJ, uint32 mW, MiB shifted into bytes, uint32 others).
func fieldMax(name string) float64 {
	switch name {
	case dcgmEnergy:
		return math.MaxUint64
	case dcgmPower:
		return math.MaxUint32 / 1e3
	case dcgmFBUsed:
		return math.MaxUint64 >> 20
	}
	return math.MaxUint32
}

// judge parses a value and says why it is refused: value_nan, value_inf,
// value_negative, value_out_of_range (too large for its field), or
// dcgm_malformed (not a number). "" means taken.
func judge(name string, text []byte) (float64, string) {
	v, err := strconv.ParseFloat(string(text), 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange):
		return 0, reasonMalformed
	case math.IsNaN(v):
		return 0, reasonNaN
	case math.IsInf(v, 0):
		return 0, reasonInf
	case v < 0:
		return 0, reasonNegative
	case v >= fieldMax(name):
		return 0, reasonOutOfRange
	}
	return v, ""
}

// set puts a judged value into its Reading field.
func set(r *Reading, name string, v float64) {
	switch name {
	case dcgmEnergy:
		r.EnergyMJ, r.HasEnergy = uint64(v), true
	case dcgmPower:
		r.PowerMW, r.HasPower = uint32(math.Round(v*1e3)), true
	case dcgmUtil:
		r.UtilGPU = uint32(v)
	case dcgmFBUsed:
		r.MemUsed = uint64(v) << 20
	case dcgmSMClock:
		r.SMClockMHz = uint32(v)
	case dcgmMemClock:
		r.MemClockMHz = uint32(v)
	case dcgmTemp:
		r.TempC = uint32(v)
	}
}

func (s *dcgmSource) Devices() []DeviceInfo { return s.infos }

// Origin names the source in the record's energy_source (dcgm_counter…).
func (s *dcgmSource) Origin() string { return "dcgm" }

func (s *dcgmSource) Close() error { s.client.CloseIdleConnections(); return nil }

// Read returns GPU i from the latest scrape; Read(0) scrapes first. An
// exporter that cannot be read (unreachable, too slow, a page too large)
// fails every GPU's read; a GPU missing from the exposition fails its
// own. Each, a value refused and a counter that went down (a node
// reboot), is reported to the Faults with its reason.
func (s *dcgmSource) Read(i int) (Reading, error) {
	d := s.infos[i]
	if i == 0 {
		sc, err := s.scrape(context.Background(), func(x *pageLine) bool { return s.ours[string(x.uuid)] }, nil)
		s.cur, s.refused, s.err = sc.cur, sc.refused, err
		if se := (*scrapeError)(nil); errors.As(err, &se) {
			s.faults.Report(se.reason, err)
		}
	}
	if s.err != nil {
		return Reading{}, fmt.Errorf("gpu %d (%s): %w", d.Index, d.UUID, s.err)
	}
	rp := s.cur[d.UUID]
	if rp == nil || (!rp.HasEnergy && !rp.HasPower) {
		if why, refused := s.refused[d.UUID]; refused { // counted when refused
			return Reading{}, fmt.Errorf("gpu %d (%s): no energy or power value taken from %s (%s)", d.Index, d.UUID, s.t.URL, why)
		}
		err := fmt.Errorf("gpu %d (%s): not in the exposition of %s", d.Index, d.UUID, s.t.URL)
		s.faults.Report("gpu_missing", err)
		return Reading{}, err
	}
	r := *rp
	if prev, had := s.prevMJ[d.UUID]; had && r.HasEnergy && r.EnergyMJ < prev {
		s.faults.Report("counter_reset", fmt.Errorf("gpu %d (%s): energy counter went from %d to %d mJ (node reboot or driver reload); this interval integrates power", d.Index, d.UUID, prev, r.EnergyMJ))
	}
	if r.HasEnergy {
		s.prevMJ[d.UUID] = r.EnergyMJ
	}
	return r, nil
}
