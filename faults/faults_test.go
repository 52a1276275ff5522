//go:build linux

package faults

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// quickStream answers every chat request with a short stream: three
// tokens, a finish reason, the usage chunk when it was asked for, [DONE].
func quickStream(w http.ResponseWriter, r *http.Request) {
	_, body := requestModel(r)
	sseHeader(w)
	io.WriteString(w, streamText(3, "stop", false))
	if bytes.Contains(body, []byte(`"include_usage":true`)) {
		io.WriteString(w, usageEvent(7, 3))
	}
	io.WriteString(w, doneEvent)
}

// 1. Disk full: the records file on a 64 KiB tmpfs that a filler file
// nearly fills. Writes fail (counted, logged), no line is ever left
// half-written, and once there is room again records are written again,
// without a restart.
func TestDiskFull(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		ciOrSkip(t, "the disk-full test mounts a 64 KiB tmpfs, which needs root")
	}
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		ciOrSkip(t, fmt.Sprintf("cannot mount a tmpfs here (%v)", err))
	}
	t.Cleanup(func() { // after the sidecar's cleanup: it holds the file open
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	filler := filepath.Join(dir, "filler")
	// 56 KiB of 64: a few records fit, then a batch meets the full disk
	// part-way through its write.
	if err := os.WriteFile(filler, make([]byte, 56<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "records.jsonl")
	up := upstream(t, quickStream)
	s := startSidecar(t, "--upstream", up.URL, "--records", path)
	c := newClient(t)

	sent := 0
	deadline := time.Now().Add(60 * time.Second)
	var werr, dropped float64
	for sent < 400 && time.Now().Before(deadline) {
		resp, body := postAll(t, c, s.proxy, chatBody(fmt.Sprintf("before-%d", sent), true))
		sent++
		if resp.StatusCode != 200 || !strings.HasSuffix(string(body), doneEvent) {
			t.Fatalf("request %d: %s %q", sent, resp.Status, body)
		}
		m := s.metrics()
		werr, _ = metricSum(m, "tokentap_records_write_errors_total")
		dropped, _ = metricSum(m, "tokentap_records_dropped_total")
		if werr > 0 && dropped > 0 {
			break
		}
	}
	if werr == 0 || dropped == 0 {
		t.Fatalf("after %d requests: write errors %v, dropped %v; want both above 0", sent, werr, dropped)
	}
	// Every finished record is counted once, written or dropped, and the
	// file holds exactly the written ones, each whole.
	var written float64
	if !waitUntil(5*time.Second, func() bool {
		m := s.metrics()
		written, _ = metricSum(m, "tokentap_records_written_total")
		dropped, _ = metricSum(m, "tokentap_records_dropped_total")
		return int(written+dropped) == sent
	}) {
		t.Fatalf("written %v + dropped %v != %d requests", written, dropped, sent)
	}
	rs := readRecords(t, path) // fails on a truncated or broken line
	if len(rs) != int(written) {
		t.Fatalf("the file has %d records, tokentap_records_written_total says %v", len(rs), written)
	}
	if !s.log.waitFor("records file: write failed, records dropped", 5*time.Second) ||
		!strings.Contains(s.log.String(), "no space left on device") {
		t.Errorf("the log has no line about the failed write (ENOSPC)")
	}
	t.Logf("disk full after %d requests: written %v, write errors %v, dropped %v; %d whole records in the file",
		sent, written, werr, dropped, len(rs))

	// Room again: records are written again by themselves.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	const after = 10
	for i := range after {
		resp, _ := postAll(t, c, s.proxy, chatBody(fmt.Sprintf("after-%d", i), true))
		if resp.StatusCode != 200 {
			t.Fatalf("after: %s", resp.Status)
		}
	}
	rs = waitRecords(t, path, int(written)+after, 10*time.Second)
	var got []string
	for _, r := range rs {
		if strings.HasPrefix(r.Model, "after-") {
			got = append(got, r.Model)
		}
		if r.Outcome != "success" {
			t.Errorf("record %s (%s): outcome %s/%s", r.ID, r.Model, r.Outcome, r.ErrorType)
		}
	}
	if len(got) != after || len(rs) != int(written)+after {
		t.Errorf("after the room came back: %d new records (%v), %d in all; want %d new, %v in all", len(got), got, len(rs), after, int(written)+after)
	}
	if w2 := s.metric("tokentap_records_written_total"); int(w2) != int(written)+after {
		t.Errorf("tokentap_records_written_total %v, want %v", w2, int(written)+after)
	}
	if !s.running() {
		t.Fatal("the sidecar exited")
	}
	if code := s.stop(); code != 0 {
		t.Errorf("exit status %d after SIGTERM", code)
	}
	readRecords(t, path)
}

// 2. Rotation: mv records.jsonl records.1, then SIGHUP. The sidecar stays
// up, the old records stay in records.1, the new ones go to a new
// records.jsonl, and none is lost, not even those of requests running
// across the rotation.
func TestRotation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "records.jsonl")
	up := upstream(t, quickStream)
	s := startSidecar(t, "--upstream", up.URL, "--records", path)
	c := newClient(t)
	send := func(prefix string, n int) {
		for i := range n {
			resp, _ := postAll(t, c, s.proxy, chatBody(fmt.Sprintf("%s-%d", prefix, i), true))
			if resp.StatusCode != 200 {
				t.Errorf("%s-%d: %s", prefix, i, resp.Status)
			}
		}
	}
	send("before", 10)
	waitRecords(t, path, 10, 5*time.Second)

	// Requests keep flowing while the file is rotated.
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 30 {
			resp, _, err := postRead(c, s.proxy, chatBody(fmt.Sprintf("during-%d", i), true))
			if err != nil || resp.StatusCode != 200 {
				t.Errorf("during-%d: %v", i, err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	time.Sleep(60 * time.Millisecond)
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	s.signal(syscall.SIGHUP)
	if !s.log.waitFor("SIGHUP: records file reopened", 5*time.Second) {
		t.Fatal("no 'SIGHUP: records file reopened' in the log")
	}
	wg.Wait()
	send("after", 10)

	const total = 50
	var old, cur []rec
	if !waitUntil(10*time.Second, func() bool {
		old, cur = readRecords(t, path+".1"), readRecords(t, path)
		return len(old)+len(cur) >= total
	}) {
		t.Fatalf("records.1 has %d, records.jsonl %d: want %d in all", len(old), len(cur), total)
	}
	if !s.running() {
		t.Fatal("the sidecar exited on SIGHUP")
	}
	if resp, err := http.Get(s.admin + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/healthz after SIGHUP: %v", err)
	} else {
		resp.Body.Close()
	}
	seen := map[string]string{}
	for name, rs := range map[string][]rec{"records.1": old, "records.jsonl": cur} {
		for _, r := range rs {
			if f, dup := seen[r.Model]; dup {
				t.Errorf("%s is in %s and in %s", r.Model, f, name)
			}
			seen[r.Model] = name
		}
	}
	for i := range 10 {
		if f := seen[fmt.Sprintf("before-%d", i)]; f != "records.1" {
			t.Errorf("before-%d is in %q, want records.1", i, f)
		}
		if f := seen[fmt.Sprintf("after-%d", i)]; f != "records.jsonl" {
			t.Errorf("after-%d is in %q, want the new records.jsonl", i, f)
		}
	}
	if len(seen) != total {
		t.Errorf("%d distinct records, want %d (none lost)", len(seen), total)
	}
	if w := s.metric("tokentap_records_written_total"); w != total {
		t.Errorf("tokentap_records_written_total %v, want %d", w, total)
	}
	if d := s.metric("tokentap_records_dropped_total"); d != 0 {
		t.Errorf("tokentap_records_dropped_total %v, want 0", d)
	}
	t.Logf("rotation: %d records in records.1, %d in the new records.jsonl, none lost", len(old), len(cur))
}

// 3. Timeouts: idle keep-alive connections are closed after
// --idle-timeout; a client that stops sending its body is cut after
// --body-read-timeout with a 408; a stream that flows for longer than
// both is never cut.
func TestTimeouts(t *testing.T) {
	t.Parallel()
	const idleConns = 200
	const flowTokens = 30 // one every 200 ms: 6 s
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		model, _ := requestModel(r)
		if model == "flow" {
			streamTokens(w, r, flowTokens, 200*time.Millisecond, "stop", true)
			return
		}
		body := `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		io.WriteString(w, body)
	})
	path := filepath.Join(t.TempDir(), "records.jsonl")
	s := startSidecar(t, "--upstream", up.URL, "--records", path, "--idle-timeout", "2s", "--body-read-timeout", "2s")
	host := strings.TrimPrefix(s.proxy, "http://")

	var wg sync.WaitGroup
	// The flowing stream.
	var flowBody []byte
	var flowErr error
	var flowTime time.Duration
	c := newClient(t)
	wg.Go(func() {
		t0 := time.Now()
		resp, err := post(context.Background(), c, s.proxy, chatBody("flow", true))
		if err != nil {
			flowErr = err
			return
		}
		flowBody, flowErr = io.ReadAll(resp.Body)
		resp.Body.Close()
		flowTime = time.Since(t0)
	})
	// The slow body: headers and half the body, then nothing.
	var slowStatus string
	var slowTime time.Duration
	wg.Go(func() {
		conn, err := net.Dial("tcp", host)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		body := chatBody("slow", false)
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:len(body)/2])
		t0 := time.Now()
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		slowTime = time.Since(t0)
		if err != nil {
			slowStatus = "connection closed: " + err.Error()
			return
		}
		io.Copy(io.Discard, resp.Body)
		slowStatus = resp.Status
	})
	// 200 keep-alive connections: one complete request each, then idle.
	closedAfter := make([]time.Duration, idleConns)
	for i := range idleConns {
		wg.Go(func() {
			conn, err := net.Dial("tcp", host)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			body := chatBody(fmt.Sprintf("idle-%d", i), false)
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Errorf("idle %d: %v", i, err)
				return
			}
			_, err = io.Copy(io.Discard, resp.Body)
			if err != nil || resp.StatusCode != 200 || resp.Close {
				t.Errorf("idle %d: %s, close %v, %v", i, resp.Status, resp.Close, err)
				return
			}
			t0 := time.Now()
			n, err := br.Read(make([]byte, 1))
			closedAfter[i] = time.Since(t0)
			if n != 0 || !errors.Is(err, io.EOF) {
				t.Errorf("idle %d: read %d bytes, %v; want EOF when the sidecar closes it", i, n, err)
			}
		})
	}
	wg.Wait()

	slices.Sort(closedAfter)
	minIdle, maxIdle := closedAfter[0], closedAfter[len(closedAfter)-1]
	t.Logf("idle connections closed after %v .. %v (--idle-timeout 2s); slow body cut after %v (%s); flowing stream %v, %d bytes",
		minIdle.Round(time.Millisecond), maxIdle.Round(time.Millisecond), slowTime.Round(time.Millisecond), slowStatus, flowTime.Round(time.Millisecond), len(flowBody))
	// Only a lower bound: a busy machine may close them late, and one
	// never closed fails above (its read ends at the 30 s deadline, not
	// at EOF).
	if minIdle < time.Second {
		t.Errorf("idle connections closed after %v .. %v, want none before the 2 s idle timeout (less the time to read the answer, 1 s)", minIdle, maxIdle)
	}
	if !strings.HasPrefix(slowStatus, "408") && !strings.HasPrefix(slowStatus, "connection closed") {
		t.Errorf("slow body: got %q, want a 408 or the connection closed", slowStatus)
	}
	if slowTime < 1500*time.Millisecond {
		t.Errorf("slow body cut after %v, want none before the 2 s body read timeout", slowTime)
	}
	if flowErr != nil || string(flowBody) != streamText(flowTokens, "stop", true) {
		t.Errorf("flowing stream: %v, %d bytes, want the upstream's %d bytes unchanged", flowErr, len(flowBody), len(streamText(flowTokens, "stop", true)))
	}
	if flowTime < 5*time.Second {
		t.Errorf("flowing stream took %v, want about 6 s", flowTime)
	}

	rs := waitRecords(t, path, idleConns+2, 10*time.Second)
	var slow, flow []rec
	idleOK := 0
	for _, r := range rs {
		switch {
		case r.Model == "flow":
			flow = append(flow, r)
		case r.HTTPStatus == 408 || r.Model == "slow":
			slow = append(slow, r)
		case strings.HasPrefix(r.Model, "idle-") && r.Outcome == "success":
			idleOK++
		default:
			t.Errorf("unexpected record %+v", r)
		}
	}
	if idleOK != idleConns {
		t.Errorf("%d idle-connection requests recorded as success, want %d", idleOK, idleConns)
	}
	if len(slow) != 1 || slow[0].Outcome != "error" || slow[0].ErrorType != "http_4xx" || slow[0].HTTPStatus != 408 {
		t.Errorf("slow body records %+v, want one error/http_4xx with http_status 408", slow)
	}
	if len(flow) != 1 || flow[0].Outcome != "success" || flow[0].TokenEvents != flowTokens || flow[0].E2EMs == nil || *flow[0].E2EMs < 5000 {
		t.Errorf("flowing stream records %+v, want one success with %d token events over about 6 s", flow, flowTokens)
	}
	m := s.metrics()
	if v, _ := metricSum(m, "tokentap_requests_total", "outcome", "success", "traffic", "live"); v != idleConns+1 {
		t.Errorf("tokentap_requests_total{outcome=success} %v, want %d", v, idleConns+1)
	}
	if v, _ := metricSum(m, "tokentap_requests_total", "outcome", "error", "traffic", "live"); v != 1 {
		t.Errorf("tokentap_requests_total{outcome=error} %v, want 1", v)
	}
	if v, _ := metricSum(m, "gen_ai_server_request_duration_seconds_count", "error_type", "http_4xx"); v != 1 {
		t.Errorf("gen_ai_server_request_duration_seconds_count{error_type=http_4xx} %v, want 1", v)
	}
	c.CloseIdleConnections()
	if !waitUntil(5*time.Second, func() bool { return s.metric("tokentap_connections_open") == 0 }) {
		t.Errorf("tokentap_connections_open %v after every client connection was closed, want 0", s.metric("tokentap_connections_open"))
	}
}

// 4. --max-connections 20: the 21st concurrent connection gets a 503 at
// once and is counted; once connections close, new ones are accepted.
func TestMaxConnections(t *testing.T) {
	t.Parallel()
	const limit = 20
	release := make(chan struct{})
	var arrived atomic.Int64
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		requestModel(r)
		sseHeader(w)
		io.WriteString(w, tokenEvent(0, ""))
		w.(http.Flusher).Flush()
		arrived.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, tokenEvent(1, "stop")+doneEvent)
	})
	path := filepath.Join(t.TempDir(), "records.jsonl")
	s := startSidecar(t, "--upstream", up.URL, "--records", path, "--max-connections", fmt.Sprint(limit))
	c := newClient(t)
	want := tokenEvent(0, "") + tokenEvent(1, "stop") + doneEvent

	var wg sync.WaitGroup
	bodies := make([]string, limit)
	for i := range limit {
		wg.Go(func() {
			resp, err := post(context.Background(), c, s.proxy, chatBody(fmt.Sprintf("held-%d", i), true))
			if err != nil {
				t.Errorf("held %d: %v", i, err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			bodies[i] = string(b)
		})
	}
	if !waitUntil(10*time.Second, func() bool { return arrived.Load() == limit }) {
		close(release)
		t.Fatalf("%d of %d streams reached the upstream", arrived.Load(), limit)
	}
	if v := s.metric("tokentap_connections_open"); v != limit {
		t.Errorf("tokentap_connections_open %v, want %d", v, limit)
	}
	// The 21st: answered 503 before it even sends a request.
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.proxy, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(conn)
	conn.Close()
	if !strings.HasPrefix(string(got), "HTTP/1.1 503 ") || !strings.Contains(string(got), "tokentap_overloaded") {
		t.Errorf("the 21st connection got %q (%v), want a 503 tokentap_overloaded", got, err)
	}
	if v := s.metric("tokentap_connections_rejected_total"); v != 1 {
		t.Errorf("tokentap_connections_rejected_total %v, want 1", v)
	}

	close(release)
	wg.Wait()
	for i, b := range bodies {
		if b != want {
			t.Errorf("held %d: got %q, want the upstream's bytes", i, b)
		}
	}
	c.CloseIdleConnections()
	if !waitUntil(5*time.Second, func() bool { return s.metric("tokentap_connections_open") == 0 }) {
		t.Fatalf("tokentap_connections_open %v after the clients closed, want 0", s.metric("tokentap_connections_open"))
	}
	// Capacity is back: another 20 at once are all served.
	for i := range limit {
		wg.Go(func() {
			resp, err := post(context.Background(), c, s.proxy, chatBody(fmt.Sprintf("again-%d", i), true))
			if err != nil {
				t.Errorf("again %d: %v", i, err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != want {
				t.Errorf("again %d: %s %q", i, resp.Status, b)
			}
		})
	}
	wg.Wait()
	if v := s.metric("tokentap_connections_rejected_total"); v != 1 {
		t.Errorf("tokentap_connections_rejected_total %v after the connections closed, want still 1", v)
	}
	rs := waitRecords(t, path, 2*limit, 5*time.Second)
	if cb := countBy(rs); cb["success/"] != 2*limit || len(rs) != 2*limit {
		t.Errorf("records by outcome %v, want %d success (the rejected connection sent no request)", cb, 2*limit)
	}
}

// 5. Strip mode stays bounded: the sidecar injected include_usage, so it
// holds back an incomplete event it cannot yet tell from the usage chunk;
// an upstream that sends 150 MB of field lines ("event:", which strip
// mode holds, unlike comment lines) and no blank line must not make it
// hold them all. The client gets every byte, the first ones while the
// upstream is still sending, the sidecar's RSS stays under 100 MB, and
// the record says strip_overflow.
func TestStripOverflowBounded(t *testing.T) {
	t.Parallel()
	block := []byte(strings.Repeat("event: ping1234\n", 4000)) // 64,000 bytes
	const blocks = 2344                                        // 150,016,000 bytes
	const rssBound = 100 << 20
	gotFirst := make(chan struct{})
	var upSum [32]byte
	var upBytes int64
	var upInjected, heldBack atomic.Bool
	var upDone time.Time
	upFinished := make(chan struct{})
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, body := requestModel(r)
		upInjected.Store(bytes.Contains(body, []byte(`"include_usage":true`)))
		defer close(upFinished)
		sseHeader(w)
		fl := w.(http.Flusher)
		h := sha256.New()
		write := func(b []byte) bool {
			h.Write(b)
			n, err := w.Write(b)
			upBytes += int64(n)
			fl.Flush()
			return err == nil
		}
		for i := range blocks {
			if !write(block) {
				return
			}
			if i == 15 { // 1 MB sent: the client must have bytes before we go on
				select {
				case <-gotFirst:
				case <-time.After(20 * time.Second):
					heldBack.Store(true)
				}
			}
		}
		write([]byte(tokenEvent(0, "stop")))
		write([]byte(doneEvent))
		upDone = time.Now()
		copy(upSum[:], h.Sum(nil))
	})
	path := filepath.Join(t.TempDir(), "records.jsonl")
	s := startSidecar(t, "--upstream", up.URL, "--records", path)
	rss0 := s.rss()

	var maxRSS atomic.Int64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if r := s.rss(); r > maxRSS.Load() {
				maxRSS.Store(r)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	c := newClient(t)
	t0 := time.Now()
	resp, err := post(context.Background(), c, s.proxy, chatBody("flood", true))
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	buf := make([]byte, 64<<10)
	var n int64
	var firstAt time.Time
	for {
		k, err := resp.Body.Read(buf)
		if k > 0 {
			if n == 0 {
				firstAt = time.Now()
				close(gotFirst)
			}
			h.Write(buf[:k])
			n += int64(k)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading the flood after %d bytes: %v", n, err)
		}
	}
	resp.Body.Close()
	total := time.Since(t0)
	close(stopSampling)
	<-sampled
	<-upFinished
	t.Logf("strip flood: %s through in %v, first bytes after %v (upstream finished after %v); sidecar RSS %s before, %s at most",
		mb(n), total.Round(time.Millisecond), firstAt.Sub(t0).Round(time.Millisecond), upDone.Sub(t0).Round(time.Millisecond), mb(rss0), mb(maxRSS.Load()))

	if !upInjected.Load() {
		t.Errorf("the upstream did not get stream_options.include_usage: strip mode was not on")
	}
	if n != upBytes || [32]byte(h.Sum(nil)) != upSum {
		t.Errorf("the client got %d bytes (sha256 %x), the upstream sent %d (%x): want them identical", n, h.Sum(nil), upBytes, upSum)
	}
	if heldBack.Load() || firstAt.IsZero() || !firstAt.Before(upDone) {
		t.Errorf("the client's first bytes did not arrive while the upstream was sending (held back: %v)", heldBack.Load())
	}
	if maxRSS.Load() >= rssBound {
		t.Errorf("sidecar RSS reached %s, want under %s", mb(maxRSS.Load()), mb(rssBound))
	}
	rs := waitRecords(t, path, 1, 5*time.Second)
	r := rs[0]
	if r.TapFailed != "strip_overflow" || r.Outcome != "success" || !r.UsageInjected || r.FinishReason != "stop" {
		t.Errorf("record %+v, want outcome success, usage_injected, tap_failed strip_overflow, finish_reason stop", r)
	}
	if v := s.metric("tokentap_tap_failures_total", "reason", "strip_overflow"); v != 1 {
		t.Errorf(`tokentap_tap_failures_total{reason="strip_overflow"} %v, want 1`, v)
	}
}

// 6. Shutdown with streams past the grace period: they are cut when it
// is over (or at a second signal), recorded as error/shutdown, and the
// process exits non-zero.
func TestShutdownGrace(t *testing.T) {
	t.Parallel()
	shutdownCase(t, "2s", false)
}

func TestShutdownSecondSignal(t *testing.T) {
	t.Parallel()
	shutdownCase(t, "30s", true)
}

func shutdownCase(t *testing.T, grace string, second bool) {
	const streams = 50
	const tokens = 200 // one every 100 ms: 20 s
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		requestModel(r)
		streamTokens(w, r, tokens, 100*time.Millisecond, "stop", true)
	})
	path := filepath.Join(t.TempDir(), "records.jsonl")
	s := startSidecar(t, "--upstream", up.URL, "--records", path, "--shutdown-grace", grace)
	c := newClient(t)
	full := streamText(tokens, "stop", true)

	var wg sync.WaitGroup
	var started sync.WaitGroup
	started.Add(streams)
	got := make([][]byte, streams)
	for i := range streams {
		wg.Go(func() {
			once := sync.OnceFunc(started.Done)
			defer once()
			resp, err := post(context.Background(), c, s.proxy, chatBody(fmt.Sprintf("s-%d", i), true))
			if err != nil {
				t.Errorf("stream %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			buf := make([]byte, 4096)
			for {
				n, err := resp.Body.Read(buf)
				got[i] = append(got[i], buf[:n]...)
				if bytes.Contains(got[i], []byte("\n\n")) {
					once()
				}
				if err != nil {
					return
				}
			}
		})
	}
	started.Wait()
	if v := s.metric("tokentap_requests_in_flight"); v != streams {
		t.Errorf("tokentap_requests_in_flight %v, want %d", v, streams)
	}
	t0 := time.Now()
	s.signal(syscall.SIGTERM)
	if second {
		time.Sleep(time.Second)
		s.signal(syscall.SIGTERM)
	}
	code := s.wait(40 * time.Second)
	took := time.Since(t0)
	wg.Wait()
	t.Logf("--shutdown-grace %s, second signal %v: exit status %d after %v", grace, second, code, took.Round(time.Millisecond))
	if code == 0 {
		t.Errorf("exit status 0, want non-zero: streams were cut")
	}
	want := 2 * time.Second // the grace
	if second {
		want = time.Second // the second signal
	}
	// A lower bound only: the streams ran on until the grace (or the
	// second signal); a busy machine may exit later, and wait's 40 s
	// catches a hang.
	if took < want-200*time.Millisecond {
		t.Errorf("exited %v after SIGTERM, want no sooner than %v", took, want)
	}
	if !strings.Contains(s.log.String(), "streams=50") {
		t.Errorf("the log does not say that 50 streams were cut")
	}
	for i, b := range got {
		if len(b) == 0 || !strings.HasPrefix(full, string(b)) || strings.HasSuffix(string(b), doneEvent) {
			t.Errorf("stream %d: %d bytes, want a cut prefix of the upstream's stream", i, len(b))
		}
	}
	rs := readRecords(t, path) // every line whole
	cb := countBy(rs)
	if len(rs) != streams || cb["error/shutdown"] != streams {
		t.Errorf("%d records by outcome %v, want exactly %d, all error/shutdown (none cancelled)", len(rs), cb, streams)
	}
}

// 7. Truncation: a stream that ends cleanly after tokens, with neither
// [DONE] nor a finish reason, is an error (incomplete_stream); with a
// finish reason and no [DONE], a success.
func TestTruncatedStream(t *testing.T) {
	t.Parallel()
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		model, _ := requestModel(r)
		finish := ""
		if model == "finish" {
			finish = "stop"
		}
		streamTokens(w, r, 5, 0, finish, false) // then a clean end: no [DONE]
	})
	path := filepath.Join(t.TempDir(), "records.jsonl")
	s := startSidecar(t, "--upstream", up.URL, "--records", path)
	c := newClient(t)
	for _, model := range []string{"nofinish", "finish"} {
		finish := map[string]string{"finish": "stop"}[model]
		resp, b := postAll(t, c, s.proxy, chatBody(model, true))
		if resp.StatusCode != 200 || string(b) != streamText(5, finish, false) {
			t.Errorf("%s: %s %q, want the upstream's bytes", model, resp.Status, b)
		}
	}
	rs := waitRecords(t, path, 2, 5*time.Second)
	for _, r := range rs {
		switch r.Model {
		case "nofinish":
			if r.Outcome != "error" || r.ErrorType != "incomplete_stream" || r.HTTPStatus != 200 || r.TokenEvents != 5 {
				t.Errorf("no [DONE], no finish reason: record %+v, want error/incomplete_stream", r)
			}
		case "finish":
			if r.Outcome != "success" || r.ErrorType != "" || r.FinishReason != "stop" {
				t.Errorf("finish reason, no [DONE]: record %+v, want success", r)
			}
		}
	}
	m := s.metrics()
	for _, c := range [][]string{
		{"tokentap_requests_total", "gen_ai_request_model", "nofinish", "outcome", "error"},
		{"tokentap_requests_total", "gen_ai_request_model", "finish", "outcome", "success"},
		{"gen_ai_server_request_duration_seconds_count", "gen_ai_request_model", "nofinish", "error_type", "incomplete_stream"},
	} {
		if v, _ := metricSum(m, c[0], c[1:]...); v != 1 {
			t.Errorf("%s %v = %v, want 1", c[0], c[1:], v)
		}
	}
}

// 8. A password in the upstream URL appears in no log line (debug level),
// not on /metrics and not on /readyz; requests still work.
func TestUpstreamPasswordHidden(t *testing.T) {
	t.Parallel()
	const secret = "s3cretpw"
	var served atomic.Int64
	up := upstreamRaw(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v1/models":
			http.Error(w, "no list here", http.StatusInternalServerError) // logged at debug
		case r.URL.Path == "/health":
			io.WriteString(w, "ok")
		case r.Method == http.MethodPost:
			model, _ := requestModel(r)
			if model == "drop" { // a broken upstream: logged as a failed request
				conn, _, _ := w.(http.Hijacker).Hijack()
				conn.Close()
				return
			}
			served.Add(1)
			streamTokens(w, r, 3, 0, "stop", true)
		default:
			http.NotFound(w, r)
		}
	}))
	authURL := strings.Replace(up.URL, "http://", "http://admin:"+secret+"@", 1)
	path := filepath.Join(t.TempDir(), "records.jsonl")
	s := startSidecar(t, "--upstream", authURL, "--records", path, "--log-level", "debug")
	c := newClient(t)
	resp, b := postAll(t, c, s.proxy, chatBody("m", true))
	if resp.StatusCode != 200 || string(b) != streamText(3, "stop", true) || served.Load() != 1 {
		t.Fatalf("through an upstream URL with a password: %s %q", resp.Status, b)
	}
	resp, _ = postAll(t, c, s.proxy, chatBody("drop", true))
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("a dropped upstream connection: %s, want 502", resp.Status)
	}
	var pages []string
	get := func(u string) {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		pages = append(pages, u+":\n"+string(b))
	}
	get(s.admin + "/metrics")
	get(s.admin + "/readyz")
	up.Close() // now unreachable: requests fail, /readyz says why
	resp, _ = postAll(t, c, s.proxy, chatBody("m", true))
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("an unreachable upstream: %s, want 502", resp.Status)
	}
	time.Sleep(1100 * time.Millisecond) // past /readyz's one-second cache
	get(s.admin + "/readyz")
	rs := waitRecords(t, path, 3, 5*time.Second)
	if code := s.stop(); code != 0 {
		t.Errorf("exit status %d", code)
	}
	log := s.log.String()
	if !strings.Contains(log, "level=DEBUG") {
		t.Errorf("no debug line in the log: not at debug level?")
	}
	for i, line := range strings.Split(log, "\n") {
		if strings.Contains(line, secret) {
			t.Errorf("log line %d has the password: %s", i+1, line)
		}
	}
	for _, p := range pages {
		if strings.Contains(p, secret) {
			t.Errorf("the password is on %s", head([]byte(p), 2000))
		}
	}
	if cb := countBy(rs); cb["success/"] != 1 || cb["error/upstream_reset"]+cb["error/upstream_unreachable"] != 2 {
		t.Errorf("records by outcome %v", cb)
	}
	t.Logf("%d log lines at debug level, /metrics, /readyz (up and down): no password", strings.Count(log, "\n"))
}

// 9. gzip. The sidecar cannot cut its injected usage chunk out of a
// compressed body, so when it injects it asks the engine for identity
// (docs/design.md, "Compression"; this departs on purpose from "no
// injection when the client asks for gzip": every common client asks for
// gzip). What each client gets:
//
//   - one that refuses identity ("gzip, identity;q=0"): no injection (the
//     upstream's body has no stream_options), its own Accept-Encoding
//     upstream, and the upstream's gzip bytes unchanged;
//   - one that asks for gzip, in front of an engine that gzips all the
//     same: the upstream's gzip bytes unchanged (usage chunk inside), the
//     record says tap_failed content_encoding;
//   - one that asks for gzip, in front of an engine that honours
//     identity, and one that sends no Accept-Encoding: the upstream is
//     asked for identity, and the client gets the stream minus the
//     injected usage chunk.
func TestGzipUpstream(t *testing.T) {
	t.Parallel()
	type got struct {
		body []byte
		ae   string
		sent []byte
	}
	var mu sync.Mutex
	seen := map[string]*got{}
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		model, body := requestModel(r)
		g := &got{body: body, ae: r.Header.Get("Accept-Encoding")}
		plain := streamText(3, "stop", false)
		if bytes.Contains(body, []byte(`"include_usage":true`)) {
			plain += usageEvent(7, 3)
		}
		plain += doneEvent
		g.sent = []byte(plain)
		if model == "stubborn" || strings.Contains(g.ae, "gzip") {
			var zb bytes.Buffer
			zw := gzip.NewWriter(&zb)
			io.WriteString(zw, plain)
			zw.Close()
			g.sent = zb.Bytes()
			w.Header().Set("Content-Encoding", "gzip")
		}
		mu.Lock()
		seen[model] = g
		mu.Unlock()
		sseHeader(w) // streamed (chunked), as engines do
		w.Write(g.sent)
	})
	path := filepath.Join(t.TempDir(), "records.jsonl")
	s := startSidecar(t, "--upstream", up.URL, "--records", path)
	c := newClient(t) // sends no Accept-Encoding of its own

	type result struct {
		enc  string
		body []byte
	}
	res := map[string]result{}
	for _, q := range []struct{ model, ae string }{
		{"refuse", "gzip, identity;q=0"},
		{"stubborn", "gzip"},
		{"honest", "gzip"},
		{"plain", ""},
	} {
		var hdr []string
		if q.ae != "" {
			hdr = []string{"Accept-Encoding", q.ae}
		}
		resp, b := postAll(t, c, s.proxy, chatBody(q.model, true), hdr...)
		if resp.StatusCode != 200 {
			t.Errorf("%s: %s", q.model, resp.Status)
		}
		res[q.model] = result{resp.Header.Get("Content-Encoding"), b}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 4 {
		t.Fatalf("the upstream saw %d requests, want 4", len(seen))
	}
	injected := func(g *got) bool { return bytes.Contains(g.body, []byte(`"include_usage":true`)) }

	refuse := seen["refuse"]
	if bytes.Contains(refuse.body, []byte("stream_options")) || refuse.ae != "gzip, identity;q=0" {
		t.Errorf("client refusing identity: the upstream got Accept-Encoding %q and %s; want the client's own and no stream_options", refuse.ae, refuse.body)
	}
	for _, m := range []string{"refuse", "stubborn"} {
		if r := res[m]; r.enc != "gzip" || !bytes.Equal(r.body, seen[m].sent) {
			t.Errorf("%s: %d bytes (Content-Encoding %q), want the upstream's %d gzip bytes unchanged", m, len(r.body), r.enc, len(seen[m].sent))
		}
	}
	for _, m := range []string{"stubborn", "honest", "plain"} {
		if g := seen[m]; g.ae != "identity" || !injected(g) {
			t.Errorf("%s: the upstream got Accept-Encoding %q and %s; want identity and include_usage injected", m, g.ae, g.body)
		}
	}
	for _, m := range []string{"honest", "plain"} {
		if r, want := res[m], streamText(3, "stop", true); r.enc != "" || string(r.body) != want {
			t.Errorf("%s: got %q (Content-Encoding %q), want the stream minus the injected usage chunk %q", m, r.body, r.enc, want)
		}
	}
	rs := waitRecords(t, path, 4, 5*time.Second)
	for _, r := range rs {
		bad := r.Outcome != "success"
		switch r.Model {
		case "refuse":
			bad = bad || r.UsageInjected || r.TapFailed != "content_encoding"
		case "stubborn":
			bad = bad || !r.UsageInjected || r.TapFailed != "content_encoding"
		case "honest", "plain":
			bad = bad || !r.UsageInjected || r.TapFailed != "" || r.TokenSource != "usage" || r.OutputTokens == nil || *r.OutputTokens != 3
		}
		if bad {
			t.Errorf("record %+v", r)
		}
	}
	m := s.metrics()
	if v, _ := metricSum(m, "tokentap_usage_injected_total"); v != 3 {
		t.Errorf("tokentap_usage_injected_total %v, want 3", v)
	}
	if v, _ := metricSum(m, "tokentap_tap_failures_total", "reason", "content_encoding"); v != 2 {
		t.Errorf(`tokentap_tap_failures_total{reason="content_encoding"} %v, want 2`, v)
	}
}

// 9b. Strip mode and Content-Length: an upstream that sends its whole
// stream at once with a Content-Length (Go's net/http sets one on a
// small unflushed answer; so do buffering gateways) must not leave the
// client waiting for bytes the sidecar cut out: the client gets a
// well-framed response, the stream minus the injected usage chunk.
func TestStripContentLength(t *testing.T) {
	t.Parallel()
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, body := requestModel(r)
		s := streamText(3, "stop", false)
		if bytes.Contains(body, []byte(`"include_usage":true`)) {
			s += usageEvent(7, 3)
		}
		s += doneEvent
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Length", fmt.Sprint(len(s)))
		io.WriteString(w, s)
	})
	path := filepath.Join(t.TempDir(), "records.jsonl")
	s := startSidecar(t, "--upstream", up.URL, "--records", path)
	c := newClient(t)
	resp, b, err := postRead(c, s.proxy, chatBody("m", true))
	want := streamText(3, "stop", true)
	if err != nil || string(b) != want {
		cl := ""
		if resp != nil {
			cl = resp.Header.Get("Content-Length")
		}
		t.Errorf("got %d bytes with Content-Length %q (%v), want the %d bytes of the stream minus the injected usage chunk, well framed", len(b), cl, err, len(want))
	}
	rs := waitRecords(t, path, 1, 5*time.Second)
	if r := rs[0]; r.Outcome != "success" || !r.UsageInjected || r.TokenSource != "usage" {
		t.Errorf("record %+v, want success with usage injected", r)
	}
}

// 10. Amplification: 1 MB model names cost neither the records file (a
// record stays under 4 KB: the name is cut at 256 bytes and flagged) nor
// /metrics (they are all _other), and a model the engine lists keeps its
// own label.
func TestModelAmplification(t *testing.T) {
	t.Parallel()
	const invented = 200
	const nameBytes = 1_000_000
	var longSeen atomic.Int64
	up := upstreamRaw(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/v1/models" {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"object":"list","data":[{"id":"real-model","object":"model"}]}`)
			return
		}
		if r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		// The model's length, without decoding a megabyte of JSON.
		if _, rest, ok := bytes.Cut(body, []byte(`"model":"`)); ok && bytes.IndexByte(rest, '"') == nameBytes {
			longSeen.Add(1)
		}
		sseHeader(w) // this engine serves any name (as llama.cpp's server does)
		io.WriteString(w, streamText(3, "stop", false))
		if bytes.Contains(body, []byte(`"include_usage":true`)) {
			io.WriteString(w, usageEvent(7, 3))
		}
		io.WriteString(w, doneEvent)
	}))
	path := filepath.Join(t.TempDir(), "records.jsonl")
	s := startSidecar(t, "--upstream", up.URL, "--records", path)
	c := newClient(t)
	rss0 := s.rss()
	want := streamText(3, "stop", true)

	filler := strings.Repeat("x", nameBytes-4)
	t0 := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= invented {
					return
				}
				body := fmt.Sprintf(`{"model":"%04d%s","stream":true,"max_tokens":256,"messages":[{"role":"user","content":"hi"}]}`, i, filler)
				resp, b, err := postRead(c, s.proxy, body)
				if err != nil || resp.StatusCode != 200 || string(b) != want {
					t.Errorf("invented %d: %v %q", i, err, head(b, 200))
					return
				}
			}
		})
	}
	wg.Wait()
	for range 3 {
		resp, b := postAll(t, c, s.proxy, chatBody("real-model", true))
		if resp.StatusCode != 200 || string(b) != want {
			t.Errorf("real-model: %s %q", resp.Status, b)
		}
	}
	rss1 := s.rss()
	if longSeen.Load() != invented {
		t.Errorf("the upstream got %d whole 1 MB names, want %d (forwarded unchanged)", longSeen.Load(), invented)
	}
	rs := waitRecords(t, path, invented+3, 10*time.Second)
	maxLine, cut, real := 0, 0, 0
	for _, r := range rs {
		maxLine = max(maxLine, r.lineBytes)
		if r.lineBytes >= 4096 {
			t.Errorf("record %s is %d bytes, want under 4 KB", r.ID, r.lineBytes)
		}
		switch {
		case r.Model == "real-model":
			real++
			if r.ModelTruncated || r.Outcome != "success" {
				t.Errorf("real-model record %+v", r)
			}
		case len(r.Model) == 256 && r.ModelTruncated && strings.HasSuffix(r.Model, "xxxx"):
			cut++
		default:
			t.Errorf("record with a %d-byte model (truncated %v)", len(r.Model), r.ModelTruncated)
		}
	}
	if cut != invented || real != 3 {
		t.Errorf("%d records with the name cut at 256 bytes and flagged (want %d), %d real-model (want 3)", cut, invented, real)
	}
	m := s.metrics()
	if v, _ := metricSum(m, "tokentap_requests_total", "gen_ai_request_model", "real-model", "outcome", "success"); v != 3 {
		t.Errorf(`tokentap_requests_total{gen_ai_request_model="real-model"} %v, want 3`, v)
	}
	if v, _ := metricSum(m, "tokentap_requests_total", "gen_ai_request_model", "_other"); v != invented {
		t.Errorf(`tokentap_requests_total{gen_ai_request_model="_other"} %v, want %d`, v, invented)
	}
	if strings.Contains(m, strings.Repeat("x", 64)) || len(m) > 1<<20 {
		t.Errorf("/metrics (%d bytes) carries an invented name", len(m))
	}
	t.Logf("%d requests with 1 MB model names in %v: longest record line %d bytes, /metrics %d bytes, sidecar RSS %s before, %s after",
		invented, time.Since(t0).Round(time.Millisecond), maxLine, len(m), mb(rss0), mb(rss1))
	if rss1 > 150<<20 { // 200 MB of names went through: none may be kept
		t.Errorf("sidecar RSS %s after the 1 MB names, want under 150 MB", mb(rss1))
	}
}

// 11. A burst of 300 streams whose clients all leave after two events:
// every request is recorded as cancelled, and the sidecar's goroutines
// and descriptors come back to their baseline.
func TestMassDisconnect(t *testing.T) {
	t.Parallel()
	const streams = 300
	const slack = 10
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		model, _ := requestModel(r)
		if model == "warm" {
			streamTokens(w, r, 3, 0, "stop", true)
			return
		}
		streamTokens(w, r, 250, 20*time.Millisecond, "stop", true) // 5 s, unless the client leaves
	})
	path := filepath.Join(t.TempDir(), "records.jsonl")
	s := startSidecar(t, "--upstream", up.URL, "--records", path)
	c := newClient(t)
	// Warm up (one upstream keep-alive connection stays), then the baseline.
	postAll(t, c, s.proxy, chatBody("warm", true))
	c.CloseIdleConnections()
	waitRecords(t, path, 1, 5*time.Second)
	time.Sleep(300 * time.Millisecond)
	g0, fd0, rss0 := s.goroutines(), s.fds(), s.rss()

	// Every client reads two events, then they all leave at once.
	var wg, reached sync.WaitGroup
	reached.Add(streams)
	leave := make(chan struct{})
	for i := range streams {
		wg.Go(func() {
			once := sync.OnceFunc(reached.Done)
			defer once()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp, err := post(ctx, c, s.proxy, chatBody(fmt.Sprintf("burst-%d", i), true))
			if err != nil {
				t.Errorf("stream %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			for events := 0; events < 2; {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Errorf("stream %d: %v after %d events", i, err, events)
					return
				}
				if line == "\n" {
					events++
				}
			}
			once()
			<-leave
			cancel() // leave mid-stream
		})
	}
	reached.Wait()
	gPeak, fdPeak := s.goroutines(), s.fds()
	close(leave)
	wg.Wait()
	c.CloseIdleConnections()
	rs := waitRecords(t, path, streams+1, 20*time.Second)
	cb := countBy(rs)
	if len(rs) != streams+1 || cb["cancelled/cancelled"] != streams {
		t.Errorf("%d records by outcome %v, want %d cancelled/cancelled and the warm-up", len(rs), cb, streams)
	}
	if v := s.metric("tokentap_requests_total", "outcome", "cancelled", "traffic", "live"); v != streams {
		t.Errorf(`tokentap_requests_total{outcome="cancelled"} %v, want %d`, v, streams)
	}
	if v := s.metric("tokentap_requests_in_flight"); v != 0 {
		t.Errorf("tokentap_requests_in_flight %v, want 0", v)
	}
	var g1, fd1 int
	back := waitUntil(10*time.Second, func() bool {
		g1, fd1 = s.goroutines(), s.fds()
		return g1 <= g0+slack && fd1 <= fd0+slack
	})
	rss1 := s.rss()
	t.Logf("mass disconnect of %d streams: goroutines %d -> %d (peak) -> %d, descriptors %d -> %d -> %d, RSS %s -> %s",
		streams, g0, gPeak, g1, fd0, fdPeak, fd1, mb(rss0), mb(rss1))
	if rss1 > 256<<20 {
		t.Errorf("sidecar RSS %s after the burst, want under 256 MB", mb(rss1))
	}
	if !back {
		t.Errorf("not back to the baseline after 10 s: goroutines %d (baseline %d), descriptors %d (baseline %d), slack %d", g1, g0, fd1, fd0, slack)
	}
}
