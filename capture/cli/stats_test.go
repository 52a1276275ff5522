package cli

import (
	"encoding/json"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tokentap/tokentap/internal/usage"
)

// handTrace is a merged trace of two replicas whose figures are worked
// out by hand in TestStatsExact.
const handTrace = `{"timestamp":0,"input_length":1500,"output_length":10,"hash_ids":[1,2,3],"replica":"a","tokentap":{` + meta + `}}
{"timestamp":500,"input_length":1400,"output_length":20,"hash_ids":[1,2,4],"replica":"b"}
{"timestamp":1000,"input_length":2000,"output_length":30,"hash_ids":[1,2,3,5],"replica":"a"}
{"timestamp":1500,"input_length":100,"output_length":40,"hash_ids":[6],"replica":"b"}
{"timestamp":2500,"input_length":900,"output_length":50,"hash_ids":[1,7],"replica":"b"}
`

func statsJSON(t *testing.T, args ...string) Report {
	t.Helper()
	out, stderr, err := run(append([]string{"stats", "--json"}, args...)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var r Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return r
}

// The figures of a small hand-made trace, worked out by hand:
//
//	line  at    replica ids        seen before: anywhere / on its replica
//	1     0     a       1 2 3      0 / 0
//	2     500   b       1 2 4      2 (1 2, on a) / 0   → across 2
//	3     1000  a       1 2 3 5    3 / 3               → within 3
//	4     1500  b       6          0 / 0
//	5     2500  b       1 7        1 / 1 (line 2)      → within 1
//
// 13 blocks, 6 reused: 4 within, 2 across. An ideal cache of 2 blocks
// (the last block touched first, so a prefix's tail goes first) holds
// after each line {1,2}, {1,2}, {1,2}, {6,1}: hits 0, 2, 2, 0, 1 = 5; one
// of 8 blocks never evicts: 6. Lengths 100 900 1400 1500 2000: p50 (rank
// 3) 1400, p90 and p99 (rank 5) 2000, mean 1180. Arrivals in 1 s bins:
// 2, 2, 1; (5-1)/2.5 s = 1.6 req/s.
func TestStatsExact(t *testing.T) {
	p := write(t, t.TempDir(), map[string]string{"hand.jsonl": handTrace})["hand.jsonl"]
	r := statsJSON(t, "--sizes", "2,8", p)
	want := Report{File: p, Requests: 5, BlockSize: 512, DurationS: 2.5,
		Reuse: Reuse{Blocks: 13, Reused: 6, Within: 4, Across: 2, Share: 6.0 / 13, WithinShare: 4.0 / 13, AcrossShare: 2.0 / 13},
		Replicas: []Replica{
			{Name: "a", Requests: 2, Reuse: Reuse{Blocks: 7, Reused: 3, Within: 3, Share: 3.0 / 7, WithinShare: 3.0 / 7}},
			{Name: "b", Requests: 3, Reuse: Reuse{Blocks: 6, Reused: 3, Within: 1, Across: 2, Share: 3.0 / 6, WithinShare: 1.0 / 6, AcrossShare: 2.0 / 6}},
		},
		IdealCache: []Cache{{SizeBlocks: 2, SizeTokens: 1024, Hits: 5, Share: 5.0 / 13}, {SizeBlocks: 8, SizeTokens: 4096, Hits: 6, Share: 6.0 / 13}},
		InputLen:   Dist{Count: 5, Mean: 1180, P50: 1400, P90: 2000, P99: 2000, Max: 2000},
		OutputLen:  Dist{Count: 5, Mean: 30, P50: 30, P90: 50, P99: 50, Max: 50},
		Arrivals:   Arrivals{BinS: 1, Counts: []int64{2, 2, 1}, MeanRPS: 1.6, PeakRPS: 2},
	}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("stats:\n%+v\nwant\n%+v", r, want)
	}
	// A 1 s window: line 5 (2.5 s) sees only line 4; line 3 (1 s) still
	// sees line 1 (0 s, exactly 1 s before).
	r = statsJSON(t, "--window", "1s", "--sizes", "2", p)
	if r.WindowS == nil || *r.WindowS != 1 || r.Reuse.Reused != 5 || r.Reuse.Within != 3 || r.Reuse.Across != 2 {
		t.Errorf("1 s window: %+v", r.Reuse)
	}
	out, _, err := run("stats", p)
	if err != nil || !strings.Contains(out, "13; reused (seen anywhere earlier in the trace): 6 (46.2%): within a replica 4 (30.8%), across replicas 2 (15.4%)") {
		t.Errorf("text: %v\n%s", err, out)
	}
}

// Past MaxBins the bins widen: 700 s at 1 s is 351 bins of 2 s.
func TestStatsBinsWiden(t *testing.T) {
	p := write(t, t.TempDir(), map[string]string{"long.jsonl": `{"timestamp":0,"input_length":1,"hash_ids":[1]}
{"timestamp":700000,"input_length":1,"hash_ids":[1]}
`})["long.jsonl"]
	r := statsJSON(t, p)
	if r.Arrivals.BinS != 2 || len(r.Arrivals.Counts) != 351 || r.Arrivals.Counts[0] != 1 || r.Arrivals.Counts[350] != 1 || r.Replicas[0].Name != "" {
		t.Errorf("arrivals: %v s, %d bins, replicas %+v", r.Arrivals.BinS, len(r.Arrivals.Counts), r.Replicas)
	}
}

// --png writes a PNG of the report that decodes.
func TestStatsPNG(t *testing.T) {
	dir := t.TempDir()
	p := write(t, dir, map[string]string{"hand.jsonl": handTrace})["hand.jsonl"]
	img := filepath.Join(dir, "hand.png")
	if _, stderr, err := run("stats", "--png", img, p); err != nil {
		t.Fatalf("%v %s", err, stderr)
	}
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if m.Bounds() != image.Rect(0, 0, plotW, plotH) {
		t.Errorf("bounds %v", m.Bounds())
	}
	colours := map[[3]uint32]bool{}
	for y := 0; y < plotH; y += 2 {
		for x := 0; x < plotW; x += 2 {
			r, g, b, _ := m.At(x, y).RGBA()
			colours[[3]uint32{r >> 8, g >> 8, b >> 8}] = true
		}
	}
	for _, c := range [][3]uint32{{49, 110, 190}, {230, 130, 30}, {60, 160, 80}, {40, 40, 40}} {
		if !colours[c] {
			t.Errorf("colour %v not drawn", c)
		}
	}
}

// Bad flags and bad lines: named, exit 2.
func TestStatsBadInput(t *testing.T) {
	dir := t.TempDir()
	p := write(t, dir, map[string]string{"bad.jsonl": handTrace + `{"timestamp":1,"input_length":1,"hash_ids":[1]}` + "\n"})["bad.jsonl"]
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"stats", p}, "bad.jsonl:6: timestamp decreases"},
		{[]string{"stats", "--sizes", "8,2", p}, "--sizes: 2 after 8"},
		{[]string{"stats", "--sizes", "1,2,3,4,5,6,7,8,9", p}, "--sizes: at most 8"},
		{[]string{"stats", "--window", "-1s", "--bin", "0s", p}, "--bin: at least 1ms"},
		{[]string{"stats", p, p}, "want one trace"},
		{[]string{"stats", filepath.Join(dir, "missing.jsonl")}, "missing.jsonl"},
	} {
		if _, stderr, err := run(c.args...); usage.ExitCode(err) != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%q: exit %d, stderr %q, want %q", c.args, usage.ExitCode(err), stderr, c.want)
		}
	}
}
