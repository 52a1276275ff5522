package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
)

// blockedSink holds the first record until released: an end-of-request
// stage that takes long (10,000 SLOs to judge, a slow sink).
type blockedSink struct {
	collect
	entered, release chan struct{}
	once             sync.Once
}

func (b *blockedSink) Write(r *record.Record) {
	b.once.Do(func() { close(b.entered) })
	<-b.release
	b.collect.Write(r)
}

// With Options.Ends, the end-of-request stages never hold back the
// client's last bytes: the chunked stream ends (the client reads EOF)
// while a stage is still blocked; Ends.Wait waits for it (and gives up
// when its context does), and the record, with its terminal instant from
// before the stage, is written once it is released.
func TestEndStagesAfterTheResponse(t *testing.T) {
	events := []string{"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"b\"},\"finish_reason\":\"stop\"}]}\n\n", "data: [DONE]\n\n"}
	us := httptest.NewServer(sse(events...))
	defer us.Close()
	u, _ := url.Parse(us.URL)
	sink := &blockedSink{entered: make(chan struct{}), release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(sink.release) }) }
	var ends Ends
	p, err := New(Options{Upstream: u, Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{sink}}), Ends: &ends})
	if err != nil {
		t.Fatal(err)
	}
	fs := httptest.NewServer(p)
	defer fs.Close()
	defer release() // before fs.Close, which waits for the handler
	resp, err := http.Post(fs.URL+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	type result struct {
		body string
		err  error
	}
	read := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(resp.Body)
		read <- result{string(b), err}
	}()
	select {
	case r := <-read:
		if r.err != nil || r.body != strings.Join(events, "") || len(resp.TransferEncoding) == 0 {
			t.Fatalf("client read %q, %v (chunked %v)", r.body, r.err, resp.TransferEncoding)
		}
	case <-time.After(10 * time.Second): // a bound on a hang, not a measurement
		t.Fatal("the response did not complete while an end stage was blocked")
	}
	select {
	case <-sink.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the end stage never ran")
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ends.Wait(done); err != context.Canceled {
		t.Fatalf("Wait with a stage blocked and its context done: %v, want context.Canceled", err)
	}
	releasedAt := time.Now()
	release()
	if err := ends.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.recs) != 1 {
		t.Fatalf("%d records, want 1", len(sink.recs))
	}
	r := sink.recs[0]
	if r.Outcome != record.Success || r.OutputTokens != 2 || !r.Terminal.Before(releasedAt) {
		t.Fatalf("record %s tokens %d terminal %v (released at %v)", r.Outcome, r.OutputTokens, r.Terminal, releasedAt)
	}
}
