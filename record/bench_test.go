package record

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/tokentap/tokentap/stream"
)

// benchRecord is a finished 200-token streamed request, judged and
// traced.
func benchRecord() *Record {
	r := New(200)
	r.Arrive = time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	r.ID, r.API, r.Model, r.Traffic, r.Stream, r.Outcome, r.HTTPStatus = "0a1b2c3d-42", stream.NameChat, "meta-llama/Llama-3.1-8B-Instruct", "live", true, Success, 200
	r.TraceID, r.FinishReason, r.TokenSource, r.ResponseID = "0af7651916cd43dd8448eb211c80319c", "stop", "usage", "chatcmpl-b"
	r.FirstByte, r.FirstEvent = r.Arrive.Add(40*time.Millisecond), r.Arrive.Add(41*time.Millisecond)
	for i := range 200 {
		r.AddToken(r.Arrive.Add(time.Duration(50+20*i)*time.Millisecond+time.Duration(i)*1337), 1, true)
	}
	r.Terminal, r.InputTokens, r.OutputTokens, r.Events = r.LastToken, 12, 200, 202
	r.PromptClass, r.OutputClass, r.Load, r.LoadBucket = "short", "long", 48.3, "64"
	r.SLO = []Verdict{{Name: "interactive", Qualified: true}}
	return r
}

// BenchmarkMarshalRecord encodes one record: the end-of-request cost of
// the records file, on the request's goroutine (never per token).
func BenchmarkMarshalRecord(b *testing.B) {
	r := benchRecord()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.MarshalJSON(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFileWrite is File.Write: encode and queue; the writer
// goroutine batches the lines into one write(2).
func BenchmarkFileWrite(b *testing.B) {
	f, err := OpenFile(filepath.Join(b.TempDir(), "records.jsonl"), FileOptions{QueueSize: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	r := benchRecord()
	b.ReportAllocs()
	for b.Loop() {
		f.Write(r)
	}
	b.StopTimer()
	if err := f.Close(context.Background()); err != nil {
		b.Fatal(err)
	}
}
