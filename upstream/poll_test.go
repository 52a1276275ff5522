package upstream

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// memEngine is an engine in memory (synctest cannot use real sockets):
// it answers through a RoundTripper, at once, and notes when each path
// was asked (on the bubble's fake clock); with down set, every request
// fails as if the engine were not listening.
type memEngine struct {
	mu     sync.Mutex
	start  time.Time
	routes map[string][2]string
	down   bool
	asked  map[string][]time.Duration
}

func newMemEngine(routes map[string][2]string) *memEngine {
	return &memEngine{start: time.Now(), routes: routes, asked: map[string][]time.Duration{}}
}

func (e *memEngine) RoundTrip(req *http.Request) (*http.Response, error) {
	e.mu.Lock()
	down, routes := e.down, e.routes
	e.asked[req.URL.Path] = append(e.asked[req.URL.Path], time.Since(e.start))
	e.mu.Unlock()
	if down {
		return nil, errors.New("connection refused")
	}
	w := httptest.NewRecorder()
	engineHandler(routes, nil).ServeHTTP(w, req)
	return w.Result(), nil
}

func (e *memEngine) times(path string) []time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.asked[path])
}

func seconds(s ...float64) []time.Duration {
	var d []time.Duration
	for _, x := range s {
		d = append(d, time.Duration(x*float64(time.Second)))
	}
	return d
}

// runLoop runs u.Run in the bubble; the returned func stops it and waits
// until it has returned.
func runLoop(u *Upstream, setEngine func(string)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { u.Run(ctx, setEngine); close(done) }()
	return func() { cancel(); <-done }
}

// One loop asks everything, on the fake clock: at start one round finds
// the health endpoint, detects the engine and reads the model list; then
// the health check every 5 s and the model list every minute. Polls due
// together share their GETs: in front of Ollama (/v1/models is its
// health endpoint too), the first round asks /v1/models once for the
// health check, detection and the model list, and the round at 60 s
// once for the health check and the model list. /readyz within a second
// of a check answers from it.
func TestPollLoopMergesPolls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		eng := newMemEngine(ollamaRoutes)
		var mu sync.Mutex
		var lists []time.Duration
		var kinds []string
		u := New(Options{URL: &url.URL{Scheme: "http", Host: "engine.test"}, Transport: eng,
			SetModels: func(names []string) {
				mu.Lock()
				defer mu.Unlock()
				if !slices.Equal(names, []string{"tiny:latest"}) {
					t.Errorf("models %q", names)
				}
				lists = append(lists, time.Since(eng.start))
			}})
		stop := runLoop(u, func(k string) { mu.Lock(); kinds = append(kinds, k); mu.Unlock() })
		time.Sleep(60*time.Second + time.Millisecond)
		synctest.Wait()
		want := seconds(0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60)
		if got := eng.times("/v1/models"); !slices.Equal(got, want) {
			t.Errorf("GET /v1/models at %v, want %v", got, want)
		}
		for _, p := range []string{"/health", "/api/version"} {
			if got := eng.times(p); !slices.Equal(got, seconds(0)) {
				t.Errorf("GET %s at %v, want once at start", p, got)
			}
		}
		mu.Lock()
		if !slices.Equal(lists, seconds(0, 60)) || !slices.Equal(kinds, []string{"ollama"}) {
			t.Errorf("model list read at %v; proxy told %q", lists, kinds)
		}
		mu.Unlock()

		h := u.Readiness(nil)
		if code, _ := readyz(t, h); code != 200 || len(eng.times("/v1/models")) != 13 {
			t.Errorf("/readyz %d a millisecond after a check asked the engine again", code)
		}
		time.Sleep(time.Second)
		if code, _ := readyz(t, h); code != 200 || !slices.Equal(eng.times("/v1/models")[13:], seconds(61.001)) {
			t.Errorf("/readyz %d a second after the check: asked at %v", code, eng.times("/v1/models")[13:])
		}
		stop()
	})
}

// Detection is asked again every 2 s while the engine answers nothing,
// every 30 s after the first minute, and never again once it told.
func TestPollLoopDetectionRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		eng := newMemEngine(vllmRoutes)
		eng.down = true
		var mu sync.Mutex
		var kinds []string
		var at []time.Duration
		u := New(Options{URL: &url.URL{Scheme: "http", Host: "engine.test"}, Transport: eng})
		stop := runLoop(u, func(k string) {
			mu.Lock()
			kinds, at = append(kinds, k), append(at, time.Since(eng.start))
			mu.Unlock()
		})
		time.Sleep(70 * time.Second)
		eng.mu.Lock()
		eng.down = false
		eng.mu.Unlock()
		time.Sleep(200 * time.Second)
		synctest.Wait()
		var want []time.Duration
		for s := 0.0; s <= 62; s += 2 {
			want = append(want, seconds(s)...)
		}
		want = append(want, seconds(92)...)
		if got := eng.times("/api/version"); !slices.Equal(got, want) {
			t.Errorf("detection asked at %v,\nwant %v", got, want)
		}
		mu.Lock()
		if !slices.Equal(kinds, []string{"vllm"}) || !slices.Equal(at, seconds(92)) {
			t.Errorf("proxy told %q at %v", kinds, at)
		}
		mu.Unlock()
		// The health check went on every 5 s throughout.
		if got := eng.times("/health"); len(got) != 55 || got[54] != 270*time.Second {
			t.Errorf("%d health checks, the last at %v", len(got), got[len(got)-1])
		}
		stop()
	})
}

// The model list: the names the engine serves; an engine that fails to
// list them keeps the last list (SetModels is not told).
func TestModels(t *testing.T) {
	var lists [][]string
	routes := map[string][2]string{"/v1/models": {"", `{"object":"list","data":[{"id":"a"},{"id":"b/c"}]}`}}
	u := New(Options{URL: fakeEngine(t, routes), SetModels: func(n []string) { lists = append(lists, n) }})
	u.refreshModels(u.round(context.Background()))
	if len(lists) != 1 || !slices.Equal(lists[0], []string{"a", "b/c"}) {
		t.Fatalf("lists %q", lists)
	}
	for _, r := range []map[string][2]string{
		{"/v1/models": {"500", "boom"}},
		{"/v1/models": {"", "not json"}},
		{},
	} {
		u := New(Options{URL: fakeEngine(t, r), SetModels: func(n []string) { t.Errorf("%v: told %q", r, n) }})
		u.refreshModels(u.round(context.Background()))
	}
	u = New(Options{URL: fakeEngine(t, map[string][2]string{"/v1/models": {"500", ""}})})
	_, err := u.models(u.round(context.Background()))
	if err == nil || err.Error() != "engine answered 500 Internal Server Error" {
		t.Fatalf("error %v", err)
	}
}
