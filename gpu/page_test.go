package gpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// pageServer serves the fixture, then (size > 0) filler up to size
// bytes, or (size < 0) filler without end, or (slow) nothing more
// until the client gives up. The filler is one 64 KiB chunk written
// again and again: the test never holds the page it serves. edit
// rewrites the fixture's lines (nil: as they are).
type pageServer struct {
	fixture string
	filler  []byte
	mu      sync.Mutex
	size    int64
	slow    bool
	edit    func(line string) string
	served  atomic.Int64 // bytes written by the answers so far
}

func newPageServer(t *testing.T) (*pageServer, string) {
	b, err := os.ReadFile("testdata/dcgm-exporter-2nodes.prom")
	if err != nil {
		t.Fatal(err)
	}
	p := &pageServer{fixture: string(b), filler: filler()}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return p, srv.URL + "/metrics"
}

// filler is 64 KiB of series of other pods and GPUs: mostly series the
// source does not read, and in every 16 lines one it reads (another
// pod's energy counter), so that both paths of the scan are exercised.
func filler() []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < 64<<10; i++ {
		name := "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
		if i%16 == 0 {
			name = dcgmEnergy
		}
		fmt.Fprintf(&b, "%s{gpu=\"%d\",UUID=\"GPU-00000000-0000-0000-0000-%012d\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-x\",namespace=\"other\",pod=\"batch-%d\"} %d\n", name, i%8, i, i, i)
	}
	return b.Bytes()[:bytes.LastIndexByte(b.Bytes()[:64<<10], '\n')+1]
}

func (p *pageServer) set(f func(p *pageServer)) { p.mu.Lock(); f(p); p.mu.Unlock() }

func (p *pageServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	size, slow, edit := p.size, p.slow, p.edit
	p.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	var n int64
	defer func() { p.served.Add(n) }()
	for _, line := range strings.SplitAfter(p.fixture, "\n") {
		if edit != nil {
			line = edit(line)
		}
		k, _ := io.WriteString(w, line)
		n += int64(k)
	}
	if slow {
		w.(http.Flusher).Flush()
		<-r.Context().Done() // a page that never ends and never grows
		return
	}
	for size < 0 || n < size {
		k, err := w.Write(p.filler)
		n += int64(k)
		if err != nil {
			return // the client stopped reading
		}
	}
}

// allocated is the bytes the process allocated so far: what a scrape
// allocates bounds what it can add to the heap at its peak.
func allocated() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// A page of 200 MB, and one that never ends, cost the scrape less than
// 64 MiB of allocations (so of heap above idle), whether the page is
// refused at its bound or read through to its end; the refusals are
// counted by reason and the next scrape of a sane page reads again.
func TestDCGMPageBounded(t *testing.T) {
	const budget = 64 << 20
	cases := []struct {
		name     string
		maxBytes int64
		timeout  time.Duration
		size     int64
		slow     bool
		reason   string // "" means read
	}{
		{"200 MB page, default bound", 0, time.Second, 200e6, false, reasonTooLarge},
		{"200 MB page, bound raised to 256 MiB: read through", 256 << 20, 30 * time.Second, 200e6, false, ""},
		{"endless page", 0, time.Second, -1, false, reasonTooLarge},
		{"endless page, bound raised to 1 TiB: the timeout ends it", 1 << 40, 200 * time.Millisecond, 0, true, reasonTimeout},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, url := newPageServer(t)
			reg := prometheus.NewRegistry()
			var log bytes.Buffer
			f := NewFaults(reg, slog.New(slog.NewTextHandler(&log, nil)))
			src, err := OpenDCGM(context.Background(), DCGMTarget{URL: url, Pod: "vllm-0", Namespace: "llm", MaxBytes: c.maxBytes}, c.timeout, f)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			p.set(func(p *pageServer) { p.size, p.slow = c.size, c.slow })
			p.served.Store(0)
			before := allocated()
			r, err := src.Read(0)
			spent := allocated() - before
			served := p.served.Load() // complete once the answer ended (a page read through)
			t.Logf("the scrape allocated %d KiB; %v", spent>>10, err)
			if spent > budget {
				t.Errorf("the scrape allocated %d MiB, over the %d MiB bound", spent>>20, budget>>20)
			}
			if c.reason == "" {
				if err != nil || r.EnergyMJ != 5551899580 || r.PowerMW != 412518 {
					t.Errorf("Read(0) = %+v, %v; want the fixture's gpu 0", r, err)
				}
				if served < c.size {
					t.Errorf("served %d bytes, want the whole page (%d)", served, c.size)
				}
				return
			}
			if err == nil {
				t.Fatalf("Read(0) = %+v; want %s", r, c.reason)
			}
			if got := testutil.ToFloat64(f.errs.WithLabelValues(c.reason)); got != 1 {
				t.Errorf("tokentap_gpu_source_errors_total{reason=%q} = %v, want 1\n%s", c.reason, got, log.String())
			}
			if !strings.Contains(log.String(), "reason="+c.reason) {
				t.Errorf("not logged with its reason:\n%s", log.String())
			}
			p.set(func(p *pageServer) { p.size, p.slow = 0, false })
			if r, err := src.Read(0); err != nil || r.EnergyMJ != 5551899580 {
				t.Errorf("the next scrape of a sane page: %+v, %v", r, err)
			}
		})
	}
}

// NaN, ±Inf, negative and out-of-range values of this pod's GPUs are
// refused by name: counted by reason, logged once per reason, never
// taken as a number (+Inf was once 0 J) and never counted as a missing
// GPU. The other field of the same GPU is still read; another pod's bad
// values are not ours to count.
func TestDCGMRefusesValuesByName(t *testing.T) {
	p, url := newPageServer(t)
	reg := prometheus.NewRegistry()
	var log bytes.Buffer
	f := NewFaults(reg, slog.New(slog.NewTextHandler(&log, nil)))
	src, err := OpenDCGM(context.Background(), DCGMTarget{URL: url, Pod: "vllm-0", Namespace: "llm"}, time.Second, f)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	// value replaces the value of series name of GPU uuid.
	value := func(vals map[[2]string]string) func(string) string {
		return func(line string) string {
			for k, v := range vals {
				if strings.HasPrefix(line, k[0]+"{") && strings.Contains(line, `UUID="`+k[1]+`"`) {
					return line[:strings.LastIndexByte(line, ' ')+1] + v + "\n"
				}
			}
			return line
		}
	}
	steps := []struct {
		vals       map[[2]string]string
		err0, err1 bool   // Read(0), Read(1) fail
		energy0    bool   // gpu 0's energy taken
		power1     uint32 // gpu 1's power, mW
	}{
		// gpu 0: energy NaN, power read. gpu 1: energy +Inf, power
		// negative: nothing to read, and not "missing".
		{map[[2]string]string{{dcgmEnergy, uuidA0}: "NaN", {dcgmEnergy, uuidA1}: "+Inf", {dcgmPower, uuidA1}: "-3.5", {dcgmEnergy, uuidB0}: "NaN"}, false, true, false, 0},
		// gpu 0: energy -Inf; gpu 1: power out of its field's range
		// (over 4.29 MW), energy read.
		{map[[2]string]string{{dcgmEnergy, uuidA0}: "-Inf", {dcgmPower, uuidA1}: "1e300"}, false, false, false, 0},
		// gpu 0's energy negative, gpu 1's temperature NaN: energy refused,
		// the rest read.
		{map[[2]string]string{{dcgmEnergy, uuidA0}: "-1", {dcgmTemp, uuidA1}: "NaN"}, false, false, false, 398250},
		// All well again.
		{nil, false, false, true, 398250},
	}
	for i, st := range steps {
		p.set(func(p *pageServer) { p.edit = value(st.vals) })
		r0, err0 := src.Read(0)
		r1, err1 := src.Read(1)
		if (err0 != nil) != st.err0 || (err1 != nil) != st.err1 {
			t.Errorf("step %d: Read(0) %v, Read(1) %v", i, err0, err1)
		}
		if r0.HasEnergy != st.energy0 || (r0.HasEnergy && r0.EnergyMJ != 5551899580) || !r0.HasPower {
			t.Errorf("step %d: gpu 0 %+v", i, r0)
		}
		if err1 == nil && (r1.PowerMW != st.power1 || r1.HasPower != (st.power1 != 0) || !r1.HasEnergy || (i == 2) != (r1.TempC == 0)) {
			t.Errorf("step %d: gpu 1 %+v, want power %d mW", i, r1, st.power1)
		}
	}
	for reason, want := range map[string]float64{reasonNaN: 2, reasonInf: 2, reasonNegative: 2, reasonOutOfRange: 1, "gpu_missing": 0} {
		if got := testutil.ToFloat64(f.errs.WithLabelValues(reason)); got != want {
			t.Errorf("tokentap_gpu_source_errors_total{reason=%q} = %v, want %v", reason, got, want)
		}
		if n := strings.Count(log.String(), "reason="+reason); n != min(1, int(want)) {
			t.Errorf("reason %s logged %d times, want once", reason, n)
		}
	}
	if !strings.Contains(log.String(), `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION of gpu 1 (`+uuidA1+`) at `+url+` is \"+Inf\": refused`) {
		t.Errorf("the log does not name the series, the GPU and the value:\n%s", log.String())
	}
	t.Logf("log:\n%s", log.String())
}

// A page naming more GPUs of this pod than a node can hold is refused
// at open (and counted at a later scrape) rather than grown into.
func TestDCGMTooManyGPUs(t *testing.T) {
	p, url := newPageServer(t)
	var extra strings.Builder
	for i := range maxDCGMGPUs + 1 {
		fmt.Fprintf(&extra, "%s{gpu=\"%d\",UUID=\"GPU-%08d\",namespace=\"llm\",pod=\"vllm-0\"} 1\n", dcgmEnergy, i, i)
	}
	p.fixture += extra.String()
	_, err := OpenDCGM(context.Background(), DCGMTarget{URL: url, Pod: "vllm-0", Namespace: "llm"}, time.Second, nil)
	if !errors.Is(err, ErrNoDCGM) || !strings.Contains(err.Error(), "more than 256 GPUs") {
		t.Errorf("OpenDCGM: %v", err)
	}
}

func TestScanPage(t *testing.T) {
	page := "# HELP x\n" +
		"\n" +
		"DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-a\",modelName=\"H\\\"100\\\\ \\n\",pod=\"p\",namespace=\"n\",other=\"}\"} 87 1700000000000\r\n" +
		"DCGM_FI_DEV_GPU_TEMP 40\n" +
		"DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-b\",} 3\n" +
		"DCGM_FI_DEV_SM_CLOCK{UUID=\"GPU-c\"}\n" + // no value
		"DCGM_FI_DEV_SM_CLOCK{UUID=\"GPU-c} 3\n" + // unterminated
		"DCGM_FI_DEV_SM_CLOCK{UUID=\"GPU-c\"} 3 soon\n" + // not a timestamp
		"DCGM_FI_DEV_SM_CLOCK{UUID=\"\\q\"} 3\n" + // bad escape
		"DCGM_FI_DEV_MEM_CLOCK{UUID=\"\xff\"} 3\n" + // not UTF-8
		"DCGM_FI_DEV_FB_USED{UUID=\"GPU-d\"} 5" // no final newline
	var got, bad []string
	err := scanPage(strings.NewReader(page), 1<<20, func(x *pageLine) {
		got = append(got, fmt.Sprintf("%s uuid=%s gpu=%s model=%q pod=%s ns=%s v=%s", x.name, x.uuid, x.gpu, x.model, x.pod, x.namespace, x.value))
	}, func(name string, err error) { bad = append(bad, name+": "+err.Error()) })
	want := []string{
		`DCGM_FI_DEV_GPU_UTIL uuid=GPU-a gpu=0 model="H\"100\\ \n" pod=p ns=n v=87`,
		`DCGM_FI_DEV_GPU_TEMP uuid= gpu= model="" pod= ns= v=40`,
		`DCGM_FI_DEV_GPU_UTIL uuid=GPU-b gpu= model="" pod= ns= v=3`,
		`DCGM_FI_DEV_FB_USED uuid=GPU-d gpu= model="" pod= ns= v=5`,
	}
	if err != nil || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("scanPage: %v\ngot:\n%s\nwant:\n%s", err, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(bad) != 5 {
		t.Errorf("refused %d lines, want 5:\n%s", len(bad), strings.Join(bad, "\n"))
	}
	t.Logf("refused:\n%s", strings.Join(bad, "\n"))

	// A line of a read series over maxLine is refused; one of another
	// series is skipped; the page goes on.
	long := dcgmPower + "{UUID=\"" + strings.Repeat("x", maxLine) + "\"} 1\n" +
		"OTHER{x=\"" + strings.Repeat("y", 3*maxLine) + "\"} 1\n" +
		dcgmPower + "{UUID=\"GPU-e\"} 2\n"
	got, bad = nil, nil
	err = scanPage(strings.NewReader(long), 1<<20, func(x *pageLine) { got = append(got, string(x.uuid)+"="+string(x.value)) },
		func(name string, err error) { bad = append(bad, name+": "+err.Error()) })
	if err != nil || len(got) != 1 || got[0] != "GPU-e=2" || len(bad) != 1 || !strings.HasPrefix(bad[0], dcgmPower+": line over") {
		t.Errorf("long lines: %v, read %q, refused %q", err, got, bad)
	}

	// The bound: a page of exactly max bytes is read, one byte more is not.
	line := dcgmPower + "{UUID=\"GPU-f\"} 2\n"
	if err := scanPage(strings.NewReader(line), int64(len(line)), func(*pageLine) {}, func(string, error) {}); err != nil {
		t.Errorf("a page of exactly its bound: %v", err)
	}
	if err := scanPage(strings.NewReader(line), int64(len(line)-1), func(*pageLine) {}, func(string, error) {}); !errors.Is(err, errPageTooLarge) {
		t.Errorf("a page one byte over its bound: %v", err)
	}
}

// Every value of the fixture the source reads, against the Prometheus
// text parser's reading of the same page.
func TestScanPageAgreesWithExpfmt(t *testing.T) {
	b, err := os.ReadFile("testdata/dcgm-exporter-2nodes.prom")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	if err := scanPage(bytes.NewReader(b), 1<<20, func(x *pageLine) {
		v, _ := strconv.ParseFloat(string(x.value), 64)
		got = append(got, fmt.Sprintf("%s %s %s %v", x.name, x.uuid, x.pod, v))
	}, func(name string, err error) { t.Errorf("%s: %v", name, err) }); err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for name, fam := range fams {
		if wanted([]byte(name)) == "" {
			continue
		}
		for _, m := range fam.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			want = append(want, fmt.Sprintf("%s %s %s %v", name, l["UUID"], l["pod"], m.GetCounter().GetValue()+m.GetGauge().GetValue()+m.GetUntyped().GetValue()))
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if strings.Join(got, "\n") != strings.Join(want, "\n") || len(got) < 7*6 {
		t.Errorf("scanPage read\n%s\nexpfmt reads\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// FuzzScanPage: any page, any bound: no panic, every kept label valid
// UTF-8 within its bound, every line read names a read series, and the
// scan never reads past max+1 bytes.
func FuzzScanPage(f *testing.F) {
	b, err := os.ReadFile("testdata/dcgm-exporter-2nodes.prom")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b, int64(1<<20))
	f.Add([]byte(dcgmEnergy+"{UUID=\"a\\\"b\\\\\",gpu=\"0\"} NaN 12\n"+dcgmPower+" -Inf\n"), int64(64))
	f.Add([]byte("# TYPE x counter\nx{a=\"b\"} 1\n"), int64(5))
	f.Fuzz(func(t *testing.T, page []byte, max int64) {
		if max < 0 || max > 1<<20 {
			max = 1 << 20
		}
		r := &countingReader{r: bytes.NewReader(page)}
		err := scanPage(r, max, func(x *pageLine) {
			if wanted([]byte(x.name)) == "" {
				t.Errorf("read a series the source does not read: %q", x.name)
			}
			for _, l := range [][]byte{x.uuid, x.gpu, x.model, x.pod, x.namespace} {
				if len(l) > maxLabel || !utf8.Valid(l) {
					t.Errorf("kept label %q", l)
				}
			}
			judge(x.name, x.value)
		}, func(string, error) {})
		if r.n > max+1 {
			t.Errorf("read %d bytes, bound %d", r.n, max)
		}
		if int64(len(page)) > max && !errors.Is(err, errPageTooLarge) {
			t.Errorf("a page of %d bytes, bound %d: %v", len(page), max, err)
		}
	})
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
