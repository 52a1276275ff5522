// Package capture freezes the live workload: one line per finished live
// request, in the Mooncake trace form that AIPerf, GuideLLM, SGLang and
// vLLM replay (package workload, docs/capture.md). A line holds the
// request's arrival, its token counts, the ids of its prompt's blocks
// (keyed digests, renumbered per file or, with fleet ids, equal across
// replicas: equal leading ids mean a shared prefix) and tokentap's own fields; never text, token ids or keys.
//
// The capture works at the end of a request only, off the token path: it
// keeps a reference to the request's body (already in memory: the
// peek's) until then, hashes its prompt, and hands the line to a
// record.File (rotation, SIGHUP, full disk, counted drops). Lines are
// written in arrival order: a finished request waits until every request
// that arrived before it has finished, or until the hold is full.
//
// The live reuse (Options.Reuse, docs/capture.md "Live reuse") counts
// each line's block ids where it is handed to the file, in the same
// order, with package prefix: the figures `sidecar capture stats` reads
// from the written trace. With no Path it computes the ids and writes
// no file.
package capture

import (
	"container/heap"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokentap/tokentap/prefix"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
	"github.com/tokentap/tokentap/workload"
)

// Defaults of Options' zero fields.
const (
	DefaultBlockTokens   = 512
	DefaultBytesPerToken = 4.0
	DefaultQueue         = 4096
	DefaultHold          = 16384
	DefaultMaxIDs        = 1 << 17
	DefaultSettle        = 5 * time.Second
)

// Options configure a Capture. The zero value of each field but Path,
// Secret and Reuse means its default.
type Options struct {
	// Path is the trace file (appended to; a non-empty file found there
	// at Open is renamed aside first: a trace's timestamps count from its
	// own first request). Empty: no file (Reuse alone; Open refuses
	// neither set).
	Path string
	// Reuse counts the live reuse of the lines' block ids (prefix.Options:
	// the window, the ideal caches' sizes, the ids remembered); nil:
	// none.
	Reuse *prefix.Options
	// Secret keys the prompt digests (LoadSecret); at least 32 bytes.
	Secret []byte
	// BlockTokens is the tokens per hash id (512, AIPerf's and
	// GuideLLM's default).
	BlockTokens int
	// BytesPerToken maps token blocks to bytes of the canonical prompt:
	// a block is BlockTokens × BytesPerToken bytes (4).
	BytesPerToken float64
	// SessionHeader names the request header that identifies a
	// conversation; "" writes no session_id.
	SessionHeader string
	// NoMeta writes the Mooncake keys alone, without the "tokentap"
	// member.
	NoMeta bool
	// Fleet writes fleet ids (capture.ids: fleet): each hash id and
	// session id is fleetID of its digest, equal on every replica whose
	// capture has the same Secret and block bytes, and each line's
	// tokentap member says so, with Replica and its file's start, so that
	// `sidecar capture merge` merges the replicas' files exactly. False:
	// ids numbered per file. Fleet needs the tokentap member (not NoMeta).
	Fleet bool
	// Replica names this sidecar on fleet lines; "" writes "".
	Replica string
	// Queue bounds the lines waiting for the file's writer (4096).
	Queue int
	// Hold bounds the finished requests waiting for earlier arrivals to
	// finish (16384).
	Hold int
	// MaxIDs bounds each of the two generations of the id renumbering
	// table (1<<17).
	MaxIDs int
	// Settle is how long a finished request waits, at least, for a
	// request that arrived before it but is not yet known to the capture
	// (its body still being read) (5s).
	Settle time.Duration
	// Logger receives the file's fault reports; nil discards them.
	Logger *slog.Logger
	// Clock tells the time; nil means time.Now.
	Clock func() time.Time
}

// Stats are a Capture's counters; they only grow, but Held.
type Stats struct {
	// Written, WriteErrors and FileDropped are the file's
	// (record.FileStats).
	Written, WriteErrors, FileDropped uint64
	// Late counts lines dropped because a request that arrived later had
	// been written already (the hold was full, or the request's body took
	// longer than Settle to read).
	Late uint64
	// Held is the number of finished requests waiting now.
	Held int
	// TableTurns counts how often a generation of the id table was full
	// and the older one was forgotten.
	TableTurns uint64
	// Reuse is the live reuse's counters; zero when Options.Reuse is
	// nil.
	Reuse ReuseStats
}

// Capture writes the trace. Its methods are safe for concurrent use; a
// nil *Capture captures nothing.
type Capture struct {
	o    Options
	file *record.File
	seed [sha256.Size]byte
	pool sync.Pool // *chain

	mu       sync.Mutex
	inflight arrivals // requests begun and not ended, by arrival
	ready    items    // finished requests' lines, by arrival
	last     int64    // arrival of the last line handed to the file
	closed   bool
	reuse    *reuse // nil: Options.Reuse nil

	late  atomic.Uint64
	turns atomic.Uint64
	held  atomic.Int64

	stop chan struct{}
	done chan struct{}
}

// Open starts a capture into o.Path, counting the live reuse when
// o.Reuse is set.
func Open(o Options) (*Capture, error) {
	if len(o.Secret) < 32 {
		return nil, errors.New("capture: the secret must be at least 32 bytes")
	}
	if o.Path == "" && o.Reuse == nil {
		return nil, errors.New("capture: neither a file nor the live reuse")
	}
	if o.Reuse != nil {
		if err := checkReuse(*o.Reuse); err != nil {
			return nil, err
		}
	}
	if o.Fleet && o.NoMeta {
		return nil, errors.New("capture: fleet ids need the tokentap member (its replica and start)")
	}
	if o.BlockTokens <= 0 {
		o.BlockTokens = DefaultBlockTokens
	}
	if o.BytesPerToken <= 0 {
		o.BytesPerToken = DefaultBytesPerToken
	}
	if o.Queue <= 0 {
		o.Queue = DefaultQueue
	}
	if o.Hold <= 0 {
		o.Hold = DefaultHold
	}
	if o.MaxIDs <= 0 {
		o.MaxIDs = DefaultMaxIDs
	}
	if o.Settle <= 0 {
		o.Settle = DefaultSettle
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	c := &Capture{o: o, stop: make(chan struct{}), done: make(chan struct{})}
	if o.Reuse != nil {
		c.reuse = newReuse(*o.Reuse)
	}
	seed := newChain(o.Secret, 1)
	seed.mac.Write([]byte("tokentap capture v1"))
	var bs [4]byte
	binary.BigEndian.PutUint32(bs[:], uint32(c.blockBytes()))
	seed.mac.Write(bs[:])
	seed.mac.Sum(c.seed[:0])
	if o.Path != "" {
		if err := moveAside(o.Path, o.Clock()); err != nil {
			return nil, fmt.Errorf("capture: %w", err)
		}
		enc := &encoder{maxIDs: o.MaxIDs, meta: !o.NoMeta, turns: &c.turns}
		if o.Fleet {
			enc.fleet = fleetMember(o.Replica)
		}
		enc.reset()
		f, err := record.OpenFile(o.Path, record.FileOptions{Logger: o.Logger, QueueSize: o.Queue, Clock: o.Clock, Encode: enc.encode})
		if err != nil {
			return nil, fmt.Errorf("capture: %w", err)
		}
		c.file = f
	}
	go c.settle()
	return c, nil
}

// moveAside renames a non-empty file at path to path.<UTC instant>.
func moveAside(path string, now time.Time) error {
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) || (err == nil && st.Size() == 0) {
		return nil
	}
	if err != nil {
		return err
	}
	return os.Rename(path, path+"."+now.UTC().Format("20060102T150405.000Z"))
}

func (c *Capture) blockBytes() int {
	return max(1, int(math.Round(float64(c.o.BlockTokens)*c.o.BytesPerToken)))
}

// Reopen reopens the file (SIGHUP after a rotation): the new file's
// timestamps and ids start again.
func (c *Capture) Reopen() error {
	if c == nil || c.file == nil {
		return nil
	}
	return c.file.Reopen()
}

// Close writes every held line (in arrival order), then closes the file
// (record.File.Close). Requests that end later are not captured.
func (c *Capture) Close(ctx context.Context) error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.stop)
		for c.ready.Len() > 0 {
			c.emit(heap.Pop(&c.ready).(*item))
		}
	}
	c.mu.Unlock()
	<-c.done
	if c.file == nil {
		return nil
	}
	return c.file.Close(ctx)
}

// Stats returns the counters.
func (c *Capture) Stats() Stats {
	if c == nil {
		return Stats{}
	}
	var fs record.FileStats
	if c.file != nil {
		fs = c.file.Stats()
	}
	st := Stats{Written: fs.Written, WriteErrors: fs.WriteErrors, FileDropped: fs.Dropped,
		Late: c.late.Load(), Held: int(c.held.Load()), TableTurns: c.turns.Load()}
	if c.reuse != nil {
		c.mu.Lock()
		st.Reuse = c.reuse.stats()
		c.mu.Unlock()
	}
	return st
}

// settle writes, while no request ends, the held lines whose Settle has
// passed.
func (c *Capture) settle() {
	defer close(c.done)
	t := time.NewTicker(c.o.Settle)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.mu.Lock()
			if !c.closed {
				c.flush()
			}
			c.mu.Unlock()
		}
	}
}

// Request is what the capture needs of a request at its start.
type Request struct {
	// Arrive is the record's arrival.
	Arrive time.Time
	// API is the request's API (stream.Name).
	API stream.Name
	// Body is the request's body, or the peek's prefix of it when Partial;
	// it is read when the request ends, never written.
	Body    []byte
	Partial bool
	// Session is the value of Options.SessionHeader; "" when none.
	Session string
}

// Entry is one captured request in flight.
type Entry struct {
	c   *Capture
	req Request
	at  int64 // Arrive, unix nanoseconds
	idx int   // in c.inflight; -1 once removed
}

// Begin is Track as the pipeline's stage (pipeline.Capture): rec has its
// arrival and API; body is the request body, or the peek's prefix of it
// when partial; h its headers, for Options.SessionHeader.
func (c *Capture) Begin(rec *record.Record, body []byte, partial bool, h http.Header) interface {
	End(rec *record.Record, model string)
} {
	r := Request{Arrive: rec.Arrive, API: rec.API, Body: body, Partial: partial}
	if c != nil && c.o.SessionHeader != "" && h != nil {
		r.Session = h.Get(c.o.SessionHeader)
	}
	if e := c.Track(r); e != nil {
		return e
	}
	return nil
}

// Track tracks a live request from its start; nil (nothing to do) for a
// nil Capture or an API without a prompt the capture reads (upgrade,
// other). The caller calls End once it has ended.
func (c *Capture) Track(r Request) *Entry {
	if c == nil {
		return nil
	}
	if a := stream.LookupAPI(string(r.API)); a == nil || a.Format == nil {
		return nil
	}
	e := &Entry{c: c, req: r, at: r.Arrive.UnixNano()}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	heap.Push(&c.inflight, e)
	c.mu.Unlock()
	return e
}

// End writes the request's line: rec is its finished record (outcome,
// counts, verdicts), model its bounded model label. Safe on a nil Entry.
func (e *Entry) End(rec *record.Record, model string) {
	if e == nil {
		return
	}
	c := e.c
	it := &item{at: e.at, b: c.line(e, rec, model)}
	e.req.Body = nil
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.idx >= 0 {
		heap.Remove(&c.inflight, e.idx)
	}
	if c.closed {
		return
	}
	heap.Push(&c.ready, it)
	c.flush()
}

// flush hands the file, in arrival order, every held line that no
// request in flight arrived before and whose Settle has passed, and the
// oldest lines beyond Hold. Called with c.mu held.
func (c *Capture) flush() {
	horizon := c.o.Clock().Add(-c.o.Settle).UnixNano()
	if c.inflight.Len() > 0 {
		horizon = min(horizon, c.inflight[0].at)
	}
	for c.ready.Len() > 0 && (c.ready[0].at <= horizon || c.ready.Len() > c.o.Hold) {
		c.emit(heap.Pop(&c.ready).(*item))
	}
	c.held.Store(int64(c.ready.Len()))
}

// emit counts one line's reuse and hands it to the file, or drops it as
// late (neither counted nor written). Called with c.mu held.
func (c *Capture) emit(it *item) {
	if it.at < c.last {
		c.late.Add(1)
		return
	}
	c.last = it.at
	if c.reuse != nil {
		c.reuse.observe(it.at, it.b)
	}
	if c.file != nil {
		c.file.WriteItem(it.b)
	}
}

// line builds the item the encoder turns into the request's line.
func (c *Capture) line(e *Entry, rec *record.Record, model string) []byte {
	a := stream.LookupAPI(string(rec.API))
	ch, _ := c.pool.Get().(*chain)
	if ch == nil {
		ch = newChain(c.o.Secret, c.blockBytes())
	}
	defer c.pool.Put(ch)
	ch.reset(c.seed)
	bytes := 0
	found := 0
	if a != nil && len(e.req.Body) > 0 {
		found = canonical(e.req.Body, a.Request.Prompt, func(p []byte) {
			bytes += len(p)
			ch.write(p)
		})
	}
	ch.finish()
	from := "prompt"
	var nonce []byte
	switch {
	case found == 0:
		from = "none"
	case e.req.Partial:
		from = "partial"
	}
	if from != "prompt" {
		nonce = make([]byte, 16)
		rand.Read(nonce)
	}
	// The engine's count is a claim that sizes the line (one id per
	// block): past workload.MaxInputLength, the most a replay reads, it
	// is not believed, as if it gave none (10^15 asked for terabytes and
	// crashed the sidecar).
	in, inFrom := rec.InputTokens, "engine"
	if in < 0 || in > workload.MaxInputLength {
		in, inFrom = 0, "none"
		if found > 0 && !e.req.Partial {
			in, inFrom = int64(math.Ceil(float64(bytes)/c.o.BytesPerToken)), "estimate"
		}
	}
	out, outFrom := rec.OutputTokens, "estimate"
	switch {
	case out < 0 || out > math.MaxInt32: // more is no count a replay reads
		out, outFrom = 0, "none"
	case rec.TokenSource == "usage":
		outFrom = "engine"
	}
	b := make([]byte, 0, 48+digestBytes*int((in+int64(c.o.BlockTokens)-1)/int64(c.o.BlockTokens))+512)
	b = binary.LittleEndian.AppendUint64(b, uint64(e.at))
	b = binary.LittleEndian.AppendUint64(b, uint64(in))
	b = binary.LittleEndian.AppendUint64(b, uint64(out))
	n := len(b)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = ch.ids(b, in, int64(c.o.BlockTokens), nonce)
	binary.LittleEndian.PutUint32(b[n:], uint32((len(b)-n-4)/digestBytes))
	if e.req.Session != "" {
		s := ch.derive(unsafeBytes(e.req.Session), 's', 0, nil)
		b = append(b, 1)
		b = append(b, s[:]...)
	} else {
		b = append(b, 0)
	}
	if !c.o.NoMeta && c.file != nil {
		m := meta(rec, model, inFrom, outFrom, from, int64(c.o.BlockTokens))
		if j, err := json.Marshal(&m); err == nil {
			b = append(b, j...)
		}
	}
	return b
}

// meta is tokentap's member of the line.
func meta(rec *record.Record, model, inFrom, outFrom, from string, block int64) workload.Meta {
	m := workload.Meta{API: string(rec.API), Model: model, Stream: rec.Stream, Outcome: string(rec.Outcome),
		ErrorType: rec.ErrorType, InputLengthFrom: inFrom, OutputLengthFrom: outFrom, HashIDsFrom: from, BlockSize: block}
	msp := func(d time.Duration, ok bool) *float64 {
		if !ok {
			return nil
		}
		v := math.Round(float64(d)/1e3) / 1e3
		return &v
	}
	m.TTFTMs = msp(rec.TTFT())
	m.TPOTMs = msp(rec.TPOT())
	m.E2EMs = msp(rec.E2E())
	for _, v := range rec.SLO {
		if v.Excluded {
			continue
		}
		if m.SLO == nil {
			m.SLO = make(map[string]string, len(rec.SLO))
		}
		m.SLO[v.Name] = "missed"
		if v.Qualified {
			m.SLO[v.Name] = "met"
		}
	}
	return m
}

// item is a finished request's line before encoding (encode.go).
type item struct {
	at int64
	b  []byte
}

// items is a min-heap of items by arrival.
type items []*item

func (h items) Len() int           { return len(h) }
func (h items) Less(i, j int) bool { return h[i].at < h[j].at }
func (h items) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *items) Push(x any)        { *h = append(*h, x.(*item)) }
func (h *items) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return x
}

// arrivals is a min-heap of requests in flight by arrival.
type arrivals []*Entry

func (h arrivals) Len() int           { return len(h) }
func (h arrivals) Less(i, j int) bool { return h[i].at < h[j].at }
func (h arrivals) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *arrivals) Push(x any) {
	e := x.(*Entry)
	e.idx = len(*h)
	*h = append(*h, e)
}
func (h *arrivals) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	e.idx = -1
	*h = old[:len(old)-1]
	return e
}
