package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// firstRunHang is how long the test waits for the first run to show
// everything before it calls the sidecar stuck. It is not the claim: how
// soon the first run shows it (about 10 s on a quiet machine; docs/live.md,
// "The first run") is the figure the test logs, and a busy machine may
// take longer without anything being wrong.
const firstRunHang = 3 * time.Minute

// The README's run command, `go run ./cmd/sidecar`, on a fresh clone with
// nothing else: soon after the start (the test logs how soon), /slo?format=json has a
// scorecard with requests and a knee state other than "not enough
// evidence", /live/data holds at least 10 finished requests (10 strips on
// /live), /metrics counts requests, and every page says it is synthetic.
// The binary is built first (so compiling is not counted) and run with
// no flag and no configuration; the environment only moves its two
// listeners to free loopback ports (TOKENTAP_LISTEN, TOKENTAP_ADMIN_LISTEN),
// so that the test runs beside another sidecar.
func TestFirstRunShowsEverything(t *testing.T) {
	bin := build(t)
	cmd := exec.Command(bin)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TOKENTAP_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "TOKENTAP_LISTEN=127.0.0.1:0", "TOKENTAP_ADMIN_LISTEN=127.0.0.1:0")
	stderr, _ := cmd.StderrPipe()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	re := regexp.MustCompile(`metrics=http://(\S+)/metrics`)
	sc := bufio.NewScanner(stderr)
	var admin string
	demo := false
	for admin == "" && sc.Scan() {
		if strings.Contains(sc.Text(), "FIRST-RUN DEMO") {
			demo = true
		}
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			admin = "http://" + m[1]
		}
	}
	go io.Copy(io.Discard, stderr)
	if admin == "" {
		t.Fatal("the sidecar did not say where its admin port is")
	}
	get := func(path string) []byte {
		res, err := http.Get(admin + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 {
			t.Fatalf("GET %s: HTTP %d %s", path, res.StatusCode, b)
		}
		return b
	}
	var knee, missing string
	var offered, strips int
	for {
		missing = ""
		var slo struct {
			Synthetic string `json:"synthetic"`
			SLOs      []struct {
				Offered   int `json:"offered"`
				Scorecard *struct {
					Knee struct {
						State string `json:"state"`
					} `json:"knee"`
					CostPerMillion *float64 `json:"cost_per_million_goodput_tokens"`
				} `json:"scorecard"`
			} `json:"slos"`
		}
		if err := json.Unmarshal(get("/slo?format=json"), &slo); err != nil {
			t.Fatal(err)
		}
		if len(slo.SLOs) == 0 || slo.SLOs[0].Scorecard == nil {
			missing = "an SLO with a scorecard"
		} else {
			offered, knee = slo.SLOs[0].Offered, slo.SLOs[0].Scorecard.Knee.State
			if offered == 0 || slo.SLOs[0].Scorecard.CostPerMillion == nil {
				missing = "requests and a cost on the scorecard"
			} else if knee == "" || knee == "not_enough_evidence" {
				missing = "a knee"
			}
		}
		if !strings.Contains(slo.Synthetic, "simulated") || !strings.Contains(slo.Synthetic, "demo") {
			t.Fatalf("/slo does not say it is synthetic: %q", slo.Synthetic)
		}
		var live struct {
			Synthetic string            `json:"synthetic"`
			Records   []json.RawMessage `json:"records"`
		}
		if err := json.Unmarshal(get("/live/data"), &live); err != nil {
			t.Fatal(err)
		}
		strips = len(live.Records)
		if strips < 10 {
			missing += " 10 strips on /live"
		}
		if missing == "" {
			break
		}
		if time.Since(start) > firstRunHang {
			t.Fatalf("%v after the start, still missing: %s (offered %d, knee %q, strips %d)", time.Since(start).Round(time.Millisecond), missing, offered, knee, strips)
		}
		time.Sleep(500 * time.Millisecond)
	}
	took := time.Since(start)
	m := string(get("/metrics"))
	if !strings.Contains(m, `tokentap_requests_total{gen_ai_operation_name="chat",gen_ai_request_model="tokentap-sim",outcome="success",probe="",traffic="live"}`) {
		t.Error("/metrics counts no demo request")
	}
	for _, path := range []string{"/", "/slo", "/probes", "/live/data"} {
		if !strings.Contains(string(get(path)), "SYNTHETIC") && !strings.Contains(string(get(path)), `"synthetic":"every number`) {
			t.Errorf("%s does not say it is synthetic", path)
		}
	}
	if !demo {
		t.Error("the log did not announce the first-run demo")
	}
	t.Logf("everything shown %v after the start: %d requests offered to the demo SLO, knee %s, %d strips", took.Round(time.Millisecond), offered, knee, strips)
	terminate(t, cmd, 15*time.Second)
}
