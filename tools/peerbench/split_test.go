package main

import (
	"strings"
	"testing"
)

// Each kind of sample of `perf script -F ip,sym,dso` goes to its part:
// the kernel's by its leaf; the tap's parse and its record helpers to
// the tap, and so do the observations it makes per event through the
// pipeline; net/http's writes under the sidecar's handler, and the
// upstream read under the tap's Read, to Go's own; the end stages'
// goroutine and the record settled in the handler to the end; GC to GC.
func TestSplitClassifies(t *testing.T) {
	cases := []struct{ sample, want string }{
		{`ffffffff81a0 tcp_sendmsg ([kernel.kallsyms])
	60c52b github.com/tokentap/tokentap/proxy.(*Proxy).ServeHTTP (sidecar)`, partKernel},
		{`2cb8f5 bufio.(*Writer).Write (sidecar)
	352fca net/http.(*response).Write (sidecar)
	601953 net/http/httputil.(*ReverseProxy).copyBuffer (sidecar)
	60c52b github.com/tokentap/tokentap/proxy.(*Proxy).ServeHTTP (sidecar)
	3769ce net/http.serverHandler.ServeHTTP (sidecar)`, partGo},
		{`3f0a11 net/http/internal.(*chunkedReader).Read (sidecar)
	6a0001 github.com/tokentap/tokentap/proxy.(*tap).readStrip (sidecar)
	6a0002 github.com/tokentap/tokentap/proxy.(*tap).Read (sidecar)
	601953 net/http/httputil.(*ReverseProxy).copyBuffer (sidecar)`, partGo},
		{`6a0001 github.com/tokentap/tokentap/proxy.(*tap).readStrip (sidecar)
	601953 net/http/httputil.(*ReverseProxy).copyBuffer (sidecar)`, partTap},
		{`5a0001 github.com/tokentap/tokentap/stream.walkObject (sidecar)
	6a0003 github.com/tokentap/tokentap/proxy.(*tap).handle (sidecar)`, partTap},
		{`1b4230 runtime.memmove (sidecar)
	5b0001 github.com/tokentap/tokentap/record.(*Record).appendEvent (sidecar)
	5b0002 github.com/tokentap/tokentap/record.(*Record).AddToken (sidecar)
	6a0003 github.com/tokentap/tokentap/proxy.(*tap).handle (sidecar)`, partTap},
		{`53cb5a github.com/tokentap/tokentap/capture.(*Capture).line (sidecar)
	5fb36b github.com/tokentap/tokentap/pipeline.(*Request).End (sidecar)
	6104d7 github.com/tokentap/tokentap/proxy.(*Proxy).endStages.func1 (sidecar)`, partEnd},
		{`1b4230 encoding/json.Marshal (sidecar)
	5b0101 github.com/tokentap/tokentap/record.(*File).batch (sidecar)
	5b0102 github.com/tokentap/tokentap/record.(*File).run (sidecar)`, partRecords},
		{`1c0001 runtime.scanobject (sidecar)
	1c0002 runtime.gcDrain (sidecar)
	1c0003 runtime.gcBgMarkWorker (sidecar)`, partGC},
		{`6c0001 github.com/tokentap/tokentap/proxy.peek (sidecar)
	60c52b github.com/tokentap/tokentap/proxy.(*Proxy).ServeHTTP (sidecar)`, partStart},
		{`1b4230 runtime.memmove (sidecar)
	5b0001 github.com/tokentap/tokentap/exporter.(*Request).ForwardDelay (sidecar)
	5b0002 github.com/tokentap/tokentap/pipeline.(*Request).ForwardDelay (sidecar)
	6a0009 github.com/tokentap/tokentap/proxy.(*tap).afterForward (sidecar)
	6a0001 github.com/tokentap/tokentap/proxy.(*tap).readStrip (sidecar)
	6a0002 github.com/tokentap/tokentap/proxy.(*tap).Read (sidecar)`, partTap},
		{`1b4230 encoding/json.Marshal (sidecar)
	5b0201 github.com/tokentap/tokentap/proxy.(*Proxy).finish (sidecar)
	5b0202 github.com/tokentap/tokentap/proxy.(*Proxy).end (sidecar)
	60c52b github.com/tokentap/tokentap/proxy.(*Proxy).ServeHTTP (sidecar)`, partEnd},
		{`93a21 runtime.findRunnable (sidecar)
	93a22 runtime.schedule (sidecar)`, partGo},
	}
	var all strings.Builder
	want := map[string]int{}
	for i, c := range cases {
		got, err := splitSamples(strings.NewReader(c.sample + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		if got[c.want] != 1 || len(got) != 1 {
			t.Errorf("sample %d: %v, want %q", i, got, c.want)
		}
		all.WriteString(c.sample + "\n\n")
		want[c.want]++
	}
	got, err := splitSamples(strings.NewReader(all.String()))
	if err != nil {
		t.Fatal(err)
	}
	for p, n := range want {
		if got[p] != n {
			t.Errorf("all samples: %q %d, want %d", p, got[p], n)
		}
	}
}

// The table is µs per event: samples ÷ hz ÷ events, a column per proxy
// and the difference from the first.
func TestSplitTable(t *testing.T) {
	got := splitTable([]string{"bare", "tokentap"},
		[]map[string]float64{{partKernel: 20, partGo: 11}, {partKernel: 21.5, partGo: 12, partTap: 3.25}},
		[]string{partKernel, partGo, partTap})
	for _, want := range []string{
		"| µs of CPU per event | bare | tokentap | tokentap − bare |",
		"| " + partKernel + " | 20.00 | 21.50 | +1.50 |",
		"| " + partTap + " | – | 3.25 | +3.25 |",
		"| **all** | 31.00 | 36.75 | +5.75 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no line %q in\n%s", want, got)
		}
	}
}
