package livetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tokentap/tokentap/app"
	"github.com/tokentap/tokentap/internal/testtool"
)

// browser starts a headless chromium for the test and returns its
// context, and the console errors and uncaught exceptions it has seen.
func browser(t *testing.T) (context.Context, func() []string) {
	t.Helper()
	bin := testtool.Need(t, "chromium")
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1400, 1000),
		chromedp.Flag("headless", true), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	var mu sync.Mutex
	var errs []string
	// Console subscribes when it returns: no message of the pages
	// opened later is lost.
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				mu.Lock()
				errs = append(errs, fmt.Sprintf("%s (%s:%d)", m, m.URL, m.Line))
				mu.Unlock()
			}
		}
	}()
	return ctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), errs...)
	}
}

// artifact returns the path a screenshot named name is written to.
func artifact(t *testing.T, name string) string {
	dir := t.TempDir()
	if d := os.Getenv("TOKENTAP_ARTIFACTS"); d != "" {
		dir = filepath.Join(d, "livetest")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, name)
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100: PNG
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := artifact(t, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}

// sidecar runs the sidecar in this process with args (its listeners on
// free loopback ports) and returns its admin and proxy base URLs.
func sidecar(t *testing.T, args ...string) (admin, proxy string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan app.Addrs, 1)
	done := make(chan error, 1)
	args = append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--energy", "off"}, args...)
	env := app.Env{Getenv: func(string) string { return "" }, Stdout: io.Discard, Stderr: io.Discard, Ready: func(a app.Addrs) { ready <- a }}
	go func() { done <- app.Run(ctx, args, env) }()
	var a app.Addrs
	select {
	case a = <-ready:
	case err := <-done:
		t.Fatalf("the sidecar did not start: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the sidecar did not start in 20 s")
	}
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return "http://" + a.Admin, "http://" + a.Proxy
}

// The scripted engine: an OpenAI-compatible streamed chat completion of
// ten token events, 20 ms apart, except for the request whose model is
// "stalls": before its events stallAt[0] and stallAt[1] it waits
// stallFor[0] and stallFor[1].
var (
	stallAt  = [2]int{3, 7}
	stallFor = [2]time.Duration{600 * time.Millisecond, 900 * time.Millisecond}
)

const (
	tokenEvents    = 10
	stallThreshold = 300 * time.Millisecond
)

func scriptedEngine(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model string `json:"model"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		if r.URL.Path == "/health" {
			return // 200: the engine is up (/readyz)
		}
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		chunk := func(delta, finish string) {
			fin := "null"
			if finish != "" {
				fin = `"` + finish + `"`
			}
			fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":%s,\"finish_reason\":%s}]}\n\n", req.Model, delta, fin)
			f.Flush()
		}
		chunk(`{"role":"assistant"}`, "")
		for i := range tokenEvents {
			wait := 20 * time.Millisecond
			for k, at := range stallAt {
				if req.Model == "stalls" && i == at {
					wait = stallFor[k]
				}
			}
			time.Sleep(wait)
			chunk(`{"content":"tok "}`, "")
		}
		chunk(`{}`, "stop")
		io.WriteString(w, "data: [DONE]\n\n")
		f.Flush()
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func send(t *testing.T, proxy, model string) {
	t.Helper()
	res, err := http.Post(proxy+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"`+model+`","stream":true,"messages":[{"role":"user","content":"a prompt the page must never show"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
}

// liveRecord is what the test reads of a record from /live/data.
type liveRecord struct {
	ID         string    `json:"id"`
	Start      time.Time `json:"start"`
	Model      string    `json:"model"`
	TokenMS    []float64 `json:"token_ms"`
	TerminalMS *float64  `json:"terminal_ms"`
	Stalls     int       `json:"stalls"`
	// Causes: why each slow event was slow (docs/measurement.md §6b).
	Causes []struct {
		What, Cause string
		AtMS        float64 `json:"at_ms"`
	} `json:"causes"`
}

func liveData(t *testing.T, admin string) (uint64, []liveRecord, string) {
	t.Helper()
	res, err := http.Get(admin + "/live/data")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	var d struct {
		Seq     uint64       `json:"seq"`
		Records []liveRecord `json:"records"`
	}
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatalf("/live/data: %v", err)
	}
	return d.Seq, d.Records, string(body)
}

func waitSeq(t *testing.T, admin string, want uint64) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if seq, _, _ := liveData(t, admin); seq >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/live/data did not reach %d records in 20 s", want)
		}
	}
}

// stripCount waits until the page draws want strips, and returns the
// count it saw last.
func stripCount(t *testing.T, ctx context.Context, want int) int {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#strips g.strip").length`))
		if err != nil {
			t.Fatal(err)
		}
		if n >= want || time.Now().After(deadline) {
			return n
		}
	}
}

// band is a stall band as the browser renders it.
type band struct {
	Left, Width      float64 // CSS pixels from the SVG's left edge
	FromMS, ToMS     float64 // its data attributes
	StripID, Outcome string
	Cause, Tip       string // its data-cause and its tooltip
}

func TestLivePageInBrowser(t *testing.T) {
	ctx, consoleErrors := browser(t)
	cfg := filepath.Join(t.TempDir(), "tokentap.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`
slo:
  stall_threshold: %v
  objectives:
    - name: chat
      target: 0.9
      thresholds: {max_itl: 500ms}
engine: {enabled: "off"}
`, stallThreshold)), 0o644)
	admin, proxy := sidecar(t, "--config", cfg, "--upstream", scriptedEngine(t))

	// Four plain requests and the one with two stalls, one after another.
	for _, m := range []string{"plain", "plain", "stalls", "plain", "plain"} {
		send(t, proxy, m)
	}
	waitSeq(t, admin, 5)
	_, recs, body := liveData(t, admin)
	if strings.Contains(body, "must never show") {
		t.Fatal("/live/data holds the prompt")
	}

	if err := chromedp.Do(ctx, chromedp.Navigate(admin+"/live"), chromedp.WaitVisible(chromedp.CSS("#strips g.strip"))); err != nil {
		t.Fatal(err)
	}
	if n := stripCount(t, ctx, len(recs)); n != len(recs) {
		t.Fatalf("the page draws %d strips, want %d: one per request sent", n, len(recs))
	}

	// The stalled request's record: two stalls, where the engine made them.
	var stalled *liveRecord
	for i := range recs {
		if recs[i].Model == "stalls" {
			stalled = &recs[i]
		}
	}
	if stalled == nil || len(stalled.TokenMS) != tokenEvents || stalled.Stalls != 2 {
		t.Fatalf("the stalled request's record: %+v, want %d token events and 2 stalls", stalled, tokenEvents)
	}
	for k, at := range stallAt {
		gap := time.Duration((stalled.TokenMS[at] - stalled.TokenMS[at-1]) * float64(time.Millisecond))
		if gap < stallFor[k] || gap > stallFor[k]+300*time.Millisecond {
			t.Errorf("stall %d: the record's gap before event %d is %v, the engine waited %v", k+1, at, gap, stallFor[k])
		}
	}

	// The axis, computed here from the records: from the earliest
	// arrival to the latest terminal instant, over the plot's width.
	var t0, t1 float64 = math.Inf(1), math.Inf(-1)
	for _, r := range recs {
		a := float64(r.Start.UnixNano()) / 1e6
		t0 = math.Min(t0, a)
		t1 = math.Max(t1, a+*r.TerminalMS)
	}
	type axisAttrs struct{ X0, PW, T0, T1 float64 }
	axis, err := chromedp.Run(ctx, chromedp.Evaluate[axisAttrs](`(() => { const s = document.getElementById("strips");
		return {X0: +s.dataset.x0, PW: +s.dataset.pw, T0: +s.dataset.t0, T1: +s.dataset.t1}; })()`))
	if err != nil {
		t.Fatal(err)
	}
	bands, err := chromedp.Run(ctx, chromedp.Evaluate[[]band](`Array.from(document.querySelectorAll("#strips rect.stall")).map(r => {
		const s = document.getElementById("strips").getBoundingClientRect(), b = r.getBoundingClientRect(), g = r.closest("g.strip");
		return {Left: b.left - s.left, Width: b.width, FromMS: +r.dataset.fromMs, ToMS: +r.dataset.toMs,
			StripID: g.dataset.id, Outcome: g.dataset.verdict, Cause: r.dataset.cause || "",
			Tip: r.querySelector("title") ? r.querySelector("title").textContent : ""}; })`))
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(axis.T0-t0) > 0.01 || math.Abs(axis.T1-t1) > 0.01 {
		t.Errorf("the page's axis is [%.3f, %.3f] ms, the records' [%.3f, %.3f]", axis.T0, axis.T1, t0, t1)
	}
	pxPerMS := axis.PW / (t1 - t0)
	// Tolerance: one CSS pixel (the renderer's rounding), plus the
	// page's two-decimal coordinates; in time, what one pixel spans.
	const tolPX = 1.0
	t.Logf("axis: %.1f ms over %.0f px (%.3f px/ms; the %.0f px tolerance is %.1f ms)", t1-t0, axis.PW, pxPerMS, tolPX, tolPX/pxPerMS)
	if len(bands) != 2 {
		t.Fatalf("%d stall bands on the page, want 2: %+v", len(bands), bands)
	}
	arrive := float64(stalled.Start.UnixNano()) / 1e6
	for k, b := range bands {
		at := stallAt[k]
		from, to := stalled.TokenMS[at-1], stalled.TokenMS[at]
		wantLeft, wantWidth := axis.X0+(arrive+from-t0)*pxPerMS, (to-from)*pxPerMS
		if b.StripID != stalled.ID || b.FromMS != from || b.ToMS != to {
			t.Errorf("stall band %d: strip %s, %v–%v ms; the record: strip %s, %v–%v ms", k+1, b.StripID, b.FromMS, b.ToMS, stalled.ID, from, to)
		}
		if math.Abs(b.Left-wantLeft) > tolPX || math.Abs(b.Width-wantWidth) > tolPX {
			t.Errorf("stall band %d drawn at %.2f px, %.2f px wide; the record puts it at %.2f px, %.2f px wide (tolerance %.0f px)",
				k+1, b.Left, b.Width, wantLeft, wantWidth, tolPX)
		}
		t.Logf("stall %d: the record's %.1f–%.1f ms after arrival; drawn at %.2f px (want %.2f), %.2f px wide (want %.2f)", k+1, from, to, b.Left, wantLeft, b.Width, wantWidth)
		if b.Outcome != "missed" {
			t.Errorf("the stalled strip is coloured %q, want missed (max ITL over 500 ms)", b.Outcome)
		}
		// Its cause, as the record has it, on hover.
		want := ""
		for _, c := range stalled.Causes {
			if c.What == "stall" && c.AtMS == from {
				want = c.Cause
			}
		}
		if want == "" || b.Cause != want || !strings.Contains(b.Tip, want) {
			t.Errorf("stall band %d: cause %q, tooltip %q; the record's cause %q (%+v)", k+1, b.Cause, b.Tip, want, stalled.Causes)
		}
	}

	// A request that finishes now appears without a reload.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.notReloaded = true`)); err != nil {
		t.Fatal(err)
	}
	send(t, proxy, "plain")
	if n := stripCount(t, ctx, len(recs)+1); n != len(recs)+1 {
		t.Fatalf("after one more request the page draws %d strips, want %d", n, len(recs)+1)
	}
	if same, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.notReloaded === true`)); err != nil || !same {
		t.Fatalf("the page was reloaded (%v)", err)
	}
	// The record shown on hover is the record line, never its prompt.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#strips g.strip[data-id="`+stalled.ID+`"] rect.bg`))); err != nil {
		t.Fatal(err)
	}
	detail, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#detail")))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(detail, stalled.ID) || !strings.Contains(detail, "max_itl_ms") || strings.Contains(detail, "must never show") ||
		!strings.Contains(detail, "why") || !strings.Contains(detail, "stall at") {
		t.Errorf("the record shown on click:\n%s", detail)
	}
	screenshot(t, ctx, "live.png")

	for _, page := range []string{"/slo", "/probes", "/"} {
		checkPage(t, ctx, admin, page)
	}
	if errs := consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors:\n%s", strings.Join(errs, "\n"))
	}
}

// checkPage opens an admin page: it renders (a heading), and every link
// on it to the admin port answers 200.
func checkPage(t *testing.T, ctx context.Context, admin, path string) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.Navigate(admin+path)); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	h1, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("h1")))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	links, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("a[href]")).map(a => a.href)`))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if h1 == "" {
		t.Errorf("%s has no heading", path)
	}
	base, _ := url.Parse(admin)
	local := 0
	for _, l := range links {
		u, err := url.Parse(l)
		if err != nil || u.Host != base.Host {
			continue // the docs' links on GitHub: not reachable from here
		}
		local++
		res, err := http.Get(l)
		if err != nil {
			t.Errorf("%s links to %s: %v", path, l, err)
			continue
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Errorf("%s links to %s: HTTP %d", path, l, res.StatusCode)
		}
	}
	if local == 0 {
		t.Errorf("%s has no link to the admin port", path)
	}
	t.Logf("%s: %q, %d links to the admin port answer 200", path, h1, local)
	name := strings.TrimPrefix(path, "/")
	if name == "" {
		name = "index"
	}
	screenshot(t, ctx, name+".png")
}

// The first run, in the browser: /live shows at least 10 strips within
// 30 s, and each page its synthetic banner.
func TestFirstRunInBrowser(t *testing.T) {
	ctx, consoleErrors := browser(t)
	start := time.Now()
	admin, _ := sidecar(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(admin+"/live")); err != nil {
		t.Fatal(err)
	}
	n := 0
	for n < 10 && time.Since(start) < 30*time.Second {
		time.Sleep(500 * time.Millisecond)
		var err error
		if n, err = chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#strips g.strip").length`)); err != nil {
			t.Fatal(err)
		}
	}
	if n < 10 {
		t.Fatalf("%d strips on /live %v after the start, want at least 10", n, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("%d strips on /live %v after the start", n, time.Since(start).Round(time.Millisecond))
	screenshot(t, ctx, "first-run-live.png")
	for _, path := range []string{"/live", "/slo", "/probes", "/"} {
		if err := chromedp.Do(ctx, chromedp.Navigate(admin+path), chromedp.WaitVisible(chromedp.ID("synthetic"))); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		banner, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("synthetic")))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if !strings.Contains(banner, "SYNTHETIC") || !strings.Contains(banner, "demo") {
			t.Errorf("%s's banner: %q", path, banner)
		}
	}
	if errs := consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors:\n%s", strings.Join(errs, "\n"))
	}
}
