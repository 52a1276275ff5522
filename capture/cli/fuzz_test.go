package cli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/tokentap/tokentap/workload"
)

// FuzzMerge: any two files (fleet lines, per-file lines, junk) merge
// without panicking. When both read whole, the merge writes every line,
// each a trace line the reader takes back, in arrival order, with ids
// renumbered by first appearance (each new id the next integer); when
// one does not, the error names a file and line. Seed corpus:
// testdata/fuzz/FuzzMerge.
func FuzzMerge(f *testing.F) {
	f.Add([]byte(`{"timestamp":0,"input_length":1024,"hash_ids":[900000000000001,2],"session_id":"5","tokentap":{"ids":"fleet","replica":"a","start_unix_ms":1000,"api":"chat","stream":true,"outcome":"success","input_length_from":"engine","output_length_from":"engine","block_size":512}}
{"timestamp":7,"input_length":512,"hash_ids":[900000000000001],"tokentap":{"ids":"fleet","replica":"a","start_unix_ms":1000,"api":"chat","stream":false,"outcome":"error","input_length_from":"engine","output_length_from":"none","block_size":512}}
`), []byte(`{"timestamp":0,"input_length":1024,"output_length":3,"hash_ids":[0,1]}
{"timestamp":2.5,"text_input":"hi","session_id":12}
`))
	f.Add([]byte(`{"timestamp":0,"input_length":1,"hash_ids":[1],"tokentap":{"ids":"fleet","start_unix_ms":5}}`), []byte("{\"timestamp\":1}\n{"))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		files := map[string][]byte{"a": a, "b": b}
		open := func(p string, max int) (*workload.Reader, io.Closer, error) {
			return workload.NewReader(bytes.NewReader(files[p]), workload.ReaderOptions{Name: p, MaxLineBytes: 1 << 16}), io.NopCloser(nil), nil
		}
		var out bytes.Buffer
		st, err := Merge(context.Background(), &out, []string{"a", "b"}, open, MergeOptions{})
		whole := true
		lines := int64(0)
		for _, p := range []string{"a", "b"} {
			r, _, _ := open(p, 0)
			for {
				_, err := r.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					whole = false
					break
				}
				lines++
			}
		}
		if err != nil {
			var le *workload.LineError
			if !errors.As(err, &le) || (le.File != "a" && le.File != "b") {
				t.Fatalf("error %v names no file and line", err)
			}
			return
		}
		if !whole || st.Lines != lines {
			t.Fatalf("merged %d lines without an error, inputs have %d (whole %v)", st.Lines, lines, whole)
		}
		r := workload.NewReader(&out, workload.ReaderOptions{Name: "merged"})
		next := int64(0)
		for {
			q, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("merged line: %v\n%s", err, out.String())
			}
			for _, id := range q.HashIDs {
				if id > next {
					t.Fatalf("line %d: id %d before %d was given", q.Line, id, next)
				}
				if id == next {
					next++
				}
			}
			if q.Replica == "" {
				t.Fatalf("line %d has no replica", q.Line)
			}
		}
	})
}

// FuzzStats: any trace gives a report or a FILE:LINE error; a report
// adds up (reused = within + across, at most the blocks; the replicas'
// requests and the bins' counts are the requests; an ideal cache hits
// no more than the reuse without a window). Seed corpus:
// testdata/fuzz/FuzzStats.
func FuzzStats(f *testing.F) {
	f.Add([]byte(handTrace), uint8(2))
	f.Add([]byte(`{"timestamp":0,"input_length":1,"hash_ids":[3,3,3],"tokentap":{"ids":"fleet","replica":"x","start_unix_ms":99,"block_size":1}}`), uint8(1))
	f.Fuzz(func(t *testing.T, trace []byte, size uint8) {
		r := workload.NewReader(bytes.NewReader(trace), workload.ReaderOptions{Name: "t", MaxLineBytes: 1 << 16})
		rep, err := Stats(context.Background(), "t", r, StatsOptions{Sizes: []int{int(size) + 1}})
		if err != nil {
			var le *workload.LineError
			if !errors.As(err, &le) || le.File != "t" {
				t.Fatalf("error %v names no line", err)
			}
			return
		}
		u := rep.Reuse
		if u.Reused != u.Within+u.Across || u.Reused > u.Blocks || u.Within < 0 || u.Across < 0 || rep.IdealCache[0].Hits > u.Reused {
			t.Fatalf("reuse %+v, cache %+v", u, rep.IdealCache)
		}
		var reqs, bins int64
		for _, p := range rep.Replicas {
			reqs += p.Requests
		}
		for _, c := range rep.Arrivals.Counts {
			bins += c
		}
		if reqs != rep.Requests || bins != rep.Requests || len(rep.Arrivals.Counts) > MaxBins {
			t.Fatalf("%d requests, replicas %d, bins %d (%d)", rep.Requests, reqs, bins, len(rep.Arrivals.Counts))
		}
	})
}
