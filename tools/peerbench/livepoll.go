package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// browser stands in for one browser tab open at the sidecar's live page
// (live/static/live.js): it loads the page and its script and style
// sheet once, then fetches /live/data?n=30 (with since= the seq of its
// last answer, as the page does) every Every, each after the last has
// been read whole and decoded, and /probes?format=json every 5 s.
type browser struct {
	Admin string        // host:port of the admin listener
	Every time.Duration // between polls of /live/data (the page: 2 s)
}

// pollStats counts what the browser got.
type pollStats struct {
	Polls     int   // /live/data answers read whole (200)
	Unchanged int   // of them, answers that said nothing changed
	Busy      int   // 503: the page's bound on polls at once
	Errors    int   // anything else: a failed fetch, a bad status, a body that is not the page's JSON
	Bytes     int64 // bytes of every answer read
	FirstErr  string
}

func (s *pollStats) fail(err error) {
	s.Errors++
	if s.FirstErr == "" {
		s.FirstErr = err.Error()
	}
}

// run polls until ctx is done.
func (b browser) run(ctx context.Context) pollStats {
	var s pollStats
	tr := &http.Transport{MaxIdleConnsPerHost: 6, DisableCompression: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	get := func(path string) ([]byte, int, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.Admin+path, nil)
		resp, err := hc.Do(req)
		if err != nil {
			return nil, 0, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		s.Bytes += int64(len(body))
		return body, resp.StatusCode, err
	}
	for _, p := range []string{"/live", "/live/static/live.css", "/live/static/live.js"} {
		if _, code, err := get(p); err != nil || code != http.StatusOK {
			if ctx.Err() != nil {
				return s
			}
			s.fail(fmt.Errorf("%s: %d %v", p, code, err))
		}
	}
	every := b.Every
	if every <= 0 {
		every = 2 * time.Second
	}
	var seq *uint64
	nextProbes := time.Now()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return s
		case <-t.C:
		}
		path := "/live/data?n=30"
		if seq != nil {
			path = "/live/data?since=" + strconv.FormatUint(*seq, 10) + "&n=30"
		}
		body, code, err := get(path)
		switch {
		case ctx.Err() != nil:
			return s
		case err != nil:
			s.fail(err)
		case code == http.StatusServiceUnavailable:
			s.Busy++
		case code != http.StatusOK:
			s.fail(fmt.Errorf("%s: HTTP %d", path, code))
		default:
			var d struct {
				Seq       *uint64           `json:"seq"`
				Unchanged bool              `json:"unchanged"`
				Records   []json.RawMessage `json:"records"`
			}
			if err := json.Unmarshal(body, &d); err != nil || d.Seq == nil {
				s.fail(errors.Join(errors.New("/live/data: not the page's document"), err))
				break
			}
			s.Polls++
			if d.Unchanged {
				s.Unchanged++
			}
			seq = d.Seq
		}
		if now := time.Now(); !now.Before(nextProbes) {
			nextProbes = now.Add(5 * time.Second)
			if _, code, err := get("/probes?format=json"); ctx.Err() == nil && (err != nil || code != http.StatusOK) {
				s.fail(fmt.Errorf("/probes: %d %v", code, err))
			}
		}
		t.Reset(every)
	}
}
