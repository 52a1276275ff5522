package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/tokentap/tokentap/stream"
)

// ReverseProxy hands its copy buffer back to the pool (copyBuffers)
// before it closes the body: the tap must parse the last read from its
// own copy, not from a buffer another response may be writing into.
func TestTapParsesItsOwnCopyOfTheLastRead(t *testing.T) {
	body := `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n"
	st := realState(8)
	tp := newTap(io.NopCloser(strings.NewReader(body)), st, bodySSE, stream.FormatOpenAI, false, 1<<20)
	p := copyBuffers{}.Get()
	if n, err := tp.Read(p); n != len(body) || err != nil {
		t.Fatalf("Read = %d, %v", n, err)
	}
	copyBuffers{}.Put(p)
	for i := range p { // the next response's bytes
		p[i] = 'z'
	}
	tp.Close()
	if st.rec.TokenEvents() != 1 || st.rec.FinishReason != "stop" || !tp.done || st.rec.Events != 2 {
		t.Errorf("token events %d, finish %q, done %v, events %d: the tap parsed a buffer it did not own",
			st.rec.TokenEvents(), st.rec.FinishReason, tp.done, st.rec.Events)
	}
}

// The proxy copies responses through 4 KiB pooled buffers, whatever the
// response's size, byte for byte.
func TestProxyCopiesThroughPooledBuffers(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 5000) // 80,000 bytes: many buffers' worth
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"x":"`+big+`"}`)
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	p, err := New(Options{Upstream: u})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.rp.BufferPool.(copyBuffers); !ok {
		t.Fatalf("BufferPool is %T", p.rp.BufferPool)
	}
	fs := httptest.NewServer(p)
	defer fs.Close()
	for range 3 {
		resp, err := http.Post(fs.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(got) != `{"x":"`+big+`"}` {
			t.Fatalf("got %d bytes, want %d, byte for byte", len(got), len(big)+8)
		}
	}
}
