package replay

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/config"
)

func fastSim() config.Simulator {
	c := config.SimulatorDefaults()
	c.MaxBatch, c.MaxQueue, c.KVCapacityTokens = 64, 256, 1<<22
	c.PrefillBase, c.PrefillPerToken, c.DecodeBase, c.DecodePerSeq = time.Millisecond, time.Microsecond, 2*time.Millisecond, 50*time.Microsecond
	c.StallProb = 0
	return c
}

// ttftSLO is the objective the capture's acceptance test judged its
// requests against (capture/accept_test.go), so that the report sets
// production's verdicts beside the replay's under one name.
const ttftSLO = `slo:
  objectives:
    - name: ttft
      target: 0.9
      thresholds: {ttft: 25ms}
`

func writeFile(t *testing.T, name, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// scriptedCapture is the capture that the capture's acceptance test
// writes from its scripted workload (500 requests, about 50 per second
// for 10.5 s; 3 system prompts, 2-turn conversations; 490 answered, 5
// cancelled, 5 rejected), kept as a golden file by that test.
const scriptedCapture = "../capture/testdata/scripted.jsonl"

// The capture of the capture's acceptance test, replayed at
// --time-scale 1 against the simulator over loopback: every request is
// accounted for (scheduled = sent + not sent; sent = answered + failed),
// every answer has output_length tokens (ignore_eos; a line of 0, a
// rejected request, asks for 1, as no engine accepts a limit of 0),
// every send's lag is measured, and production sits beside replay in
// the report.
//
// The schedule lag is a real-time figure of the machine: the test logs
// its p99 (docs/capture.md, "Replay", states the figure measured) and
// asserts only what holds on a busy machine: it is measured for each
// request sent, never negative.
func TestReplayCaptureAgainstSimulator(t *testing.T) {
	if testing.Short() {
		t.Skip("10.5 s of real-time replay")
	}
	_, sim := simulator(t, fastSim())
	url := loopback(t, sim)
	cfg := writeFile(t, "tokentap.yaml", ttftSLO)
	recs := filepath.Join(t.TempDir(), "records.jsonl")
	var rep *Report
	var out, errb bytes.Buffer
	err := Main(t.Context(), []string{"--trace", scriptedCapture, "--target", url, "--config", cfg, "--time-scale", "1", "--records", recs},
		Env{Getenv: func(string) string { return "" }, Stdout: &out, Stderr: &errb, Report: func(r *Report) { rep = r }})
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, errb.String())
	}
	t.Logf("report:\n%s", out.String())
	if len(rep.Steps) != 1 {
		t.Fatalf("%d steps", len(rep.Steps))
	}
	s := rep.Steps[0]
	if s.Scheduled != 500 || s.Sent+sum(s.NotSent) != s.Scheduled || s.Answered+sum(s.Failed) != s.Sent || s.Sent != 500 {
		t.Errorf("not every request accounted for: %s", describe(s))
	}
	if s.LengthMismatch != 0 || s.LengthUnknown != 0 || s.LengthChecked != s.Answered || s.Answered < 450 {
		t.Errorf("lengths: %s", describe(s))
	}
	if s.Lag.N != s.Sent || s.Lag.P50 < 0 || s.ArrivalRate < 45 || s.ArrivalRate > 55 {
		t.Errorf("lag %+v over %d sent, arrival rate %v", s.Lag, s.Sent, s.ArrivalRate)
	}
	t.Logf("schedule lag at %.1f req/s: p50 %v p99 %v max %v", s.ArrivalRate, s.Lag.P50, s.Lag.P99, s.Lag.Max)
	// Production: the capture judged all 500 (490 met: the cancelled
	// and rejected missed), and timed the first token of the 495 that
	// had one.
	if len(s.SLOs) != 1 || s.SLOs[0].Offered != s.Sent || s.SLOs[0].ProdJudged != 500 || s.SLOs[0].ProdMet != 490 || s.ProdTTFT.N != 495 || s.TTFT.N == 0 {
		t.Errorf("SLO and production: %+v, production TTFT %+v", s.SLOs, s.ProdTTFT)
	}
	for _, want := range []string{"SLO ttft:", "production", "schedule lag", "knee by load bucket", "TTFT", "TPOT", "ITL"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	b, err := os.ReadFile(recs)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 500 || !strings.Contains(lines[0], `"traffic":"replay"`) || !strings.Contains(lines[0], `"replay":{`) {
		t.Errorf("%d records; the first: %.300s", len(lines), lines[0])
	}
}

// Ending the context stops the replay: the request due then is recorded
// as not sent, and the report still accounts for every request.
func TestReplayShutdown(t *testing.T) {
	_, sim := simulator(t, fastSim())
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	r := New(Options{Open: openString(scriptedTrace(40, 20, 5)), Target: mustURL(loopback(t, sim)), Stream: true, IgnoreEOS: true})
	rep, err := r.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Steps[0]
	if s.StoppedBy != "shutdown" || s.NotSent[NotSentShutdown] != 1 || s.Scheduled != s.Sent+1 || s.Answered+sum(s.Failed) != s.Sent {
		t.Errorf("%s, stopped by %q", describe(s), s.StoppedBy)
	}
}
