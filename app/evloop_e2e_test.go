package app

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// The event loop is the default path for streamed answers, and
// tokentap_event_loop_streams_total counts each it relays; with
// --event-loop=false net/http carries them and it stays 0.
func TestEventLoopStreamsCounted(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		loop bool
	}{{"default", nil, true}, {"off", []string{"--event-loop=false"}, false}} {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := startSidecar(t, "", append([]string{"--upstream", "", "--demo=off"}, tc.args...)...)
			const streams = 3
			for range streams {
				resp, err := http.Post("http://"+a.Proxy+"/v1/chat/completions", "application/json",
					strings.NewReader(`{"model":"tokentap-sim","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
				if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || !strings.Contains(string(b), "data: [DONE]") {
					t.Fatalf("%d %q (err %v), want a whole stream", resp.StatusCode, b, err)
				}
			}
			want := 0.0
			if tc.loop {
				want = streams
			}
			// The counter moves before the answer's last chunk is written.
			v, ok := metricValue(scrape(t, a.Admin), "tokentap_event_loop_streams_total")
			if !ok || v != want {
				t.Errorf("tokentap_event_loop_streams_total %v (present %v), want %v", v, ok, want)
			}
		})
	}
}
