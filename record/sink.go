package record

import (
	"bufio"
	"io"
	"sync"
)

// Sink receives finished records. Implementations must be safe for
// concurrent use; Write is called once per request, never per token.
type Sink interface {
	Write(r *Record)
}

// JSONL writes one JSON line per record to an io.Writer. Lines are
// flushed as they are written, so `tail -f` sees each request when it
// ends. Write errors are counted (Errors: tokentap_records_dropped_total
// with records: -), never returned to the request path.
//
// A nil *JSONL discards everything.
type JSONL struct {
	mu     sync.Mutex
	w      *bufio.Writer
	errors uint64
}

// NewJSONL returns a sink writing to w.
func NewJSONL(w io.Writer) *JSONL { return &JSONL{w: bufio.NewWriterSize(w, 64<<10)} }

// Write appends r as one line.
func (j *JSONL) Write(r *Record) {
	if j == nil {
		return
	}
	line, _ := r.MarshalJSON()
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.w.Write(append(line, '\n')); err != nil {
		j.errors++
		return
	}
	if err := j.w.Flush(); err != nil {
		j.errors++
	}
}

// Errors reports how many records could not be written.
func (j *JSONL) Errors() uint64 {
	if j == nil {
		return 0
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.errors
}
