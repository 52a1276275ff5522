package cli

import (
	"bufio"
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/tokentap/tokentap/workload"
)

// Bounds and defaults of MergeOptions.
const (
	// MaxFiles bounds the traces one merge reads at once: each holds a
	// reader's buffer (64 KiB) and its current line.
	MaxFiles = 1024
	// DefaultMaxIDs is MergeOptions.MaxIDs' zero value: each generation of
	// the renumbering tables holds up to 1<<21 ids (about 100 MB for both
	// at most).
	DefaultMaxIDs = 1 << 21
)

// MergeOptions tune Merge. The zero value merges with DefaultMaxIDs and
// workload.DefaultMaxLineBytes, and discards the notes.
type MergeOptions struct {
	// MaxIDs bounds each of the two generations of the id and session
	// renumbering tables, as the capture's (docs/capture.md,
	// "Numbering"): past it the older generation is forgotten, counted
	// (MergeStats.Turns), and an id seen again gets a new number (sharing
	// lost, never invented). 0: DefaultMaxIDs.
	MaxIDs int
	// MaxLineBytes bounds a line (workload.ReaderOptions); 0: the default.
	MaxLineBytes int
	// Note receives what the user should know about the inputs (stderr);
	// nil discards it.
	Note func(string)
}

// MergeStats say what a merge did.
type MergeStats struct {
	// Lines is the lines written.
	Lines int64
	// Turns counts the renumbering tables' turns (MergeOptions.MaxIDs).
	Turns uint64
}

// Open opens a trace: workload.Open by default; tests give their own.
type Open func(path string, maxLine int) (*workload.Reader, io.Closer, error)

// input is one trace being merged.
type input struct {
	name  string
	src   int  // its index: its id space when its ids are per file
	fleet bool // its ids are fleet ids (its first line says)
	align int64
	r     *workload.Reader
	req   workload.Request
	abs   int64 // req's arrival, ms (since the epoch for fleet files)
	prev  int64
}

// next reads the input's next line into in.req; io.EOF after the last.
func (in *input) next(m *merger) error {
	req, err := in.r.Next()
	if err != nil {
		return err
	}
	bad := func(format string, a ...any) error {
		return &workload.LineError{File: in.name, Line: req.Line, Err: fmt.Errorf(format, a...)}
	}
	fleet := req.Tokentap != nil && req.Tokentap.IDs == "fleet"
	switch {
	case req.Tokentap != nil && req.Tokentap.IDs != "" && !fleet:
		return bad("tokentap.ids %q: want fleet, or none (ids numbered per file)", req.Tokentap.IDs)
	case in.prev >= 0 && fleet != in.fleet:
		if in.fleet {
			return bad("ids numbered per file in a file of fleet ids (its first line's): the file mixes two captures")
		}
		return bad("fleet ids in a file of ids numbered per file (its first line's): the file mixes two captures")
	}
	in.abs = in.align + req.Timestamp
	if fleet {
		if req.Tokentap.StartUnixMs <= 0 {
			return bad("fleet ids without start_unix_ms: the line's arrival is unknown")
		}
		in.abs = req.Tokentap.StartUnixMs + req.Timestamp
	}
	if in.prev >= 0 && in.abs < in.prev {
		return bad("arrival %d ms (start_unix_ms + timestamp) before the previous line's %d: a file is in arrival order", in.abs, in.prev)
	}
	if req.Tokentap != nil && req.Tokentap.BlockSize > 0 {
		switch {
		case m.block == 0:
			m.block, m.blockFrom = req.Tokentap.BlockSize, fmt.Sprintf("%s:%d", in.name, req.Line)
		case m.block != req.Tokentap.BlockSize:
			return bad("block_size %d, but %s says %d: ids of different block sizes share nothing", req.Tokentap.BlockSize, m.blockFrom, m.block)
		}
	}
	in.prev, in.req = in.abs, req
	return nil
}

// merger is one merge's state.
type merger struct {
	block     int64
	blockFrom string
	ids       table[idKey]
	sessions  table[sessionKey]
}

// idKey is a hash id in its id space: src -1 for fleet ids, the file's
// index for ids numbered per file.
type idKey struct {
	src int
	id  int64
}

type sessionKey struct {
	src int
	s   string
}

// table renumbers keys 0, 1, 2, ... by first appearance, in two bounded
// generations (the capture's encoder's rule).
type table[K comparable] struct {
	max      int
	cur, old map[K]int64
	nextID   int64
	turns    uint64
}

func (t *table[K]) number(k K) int64 {
	if n, ok := t.cur[k]; ok {
		return n
	}
	n, ok := t.old[k]
	if !ok {
		n = t.nextID
		t.nextID++
	}
	if t.cur == nil || len(t.cur) >= t.max {
		if t.cur != nil {
			t.turns++
		}
		t.old, t.cur = t.cur, make(map[K]int64)
	}
	t.cur[k] = n
	return n
}

// line is a merged trace's line.
type line struct {
	Timestamp    int64          `json:"timestamp"`
	InputLength  *int64         `json:"input_length,omitempty"`
	OutputLength *int64         `json:"output_length,omitempty"`
	HashIDs      *[]int64       `json:"hash_ids,omitempty"`
	SessionID    string         `json:"session_id,omitempty"`
	TextInput    string         `json:"text_input,omitempty"`
	Replica      string         `json:"replica,omitempty"`
	Tokentap     *workload.Meta `json:"tokentap,omitempty"`
}

// Merge writes to w, as JSON lines, the lines of the traces at paths in
// arrival order (docs/capture.md, "Merging replicas"): a fleet file's
// lines at start_unix_ms + timestamp; a file without (ids numbered per
// file) aligned to the earliest start of the fleet files, or to 0; ties
// in argument order, then file order. Each line's hash ids and session
// are renumbered by first appearance in the merged trace: fleet ids in
// one space, each other file's ids in a space of its own. Each line gets
// its replica (the line's own, its tokentap member's, else the file's
// path as given) and a timestamp counted from the merged trace's first
// line; its tokentap member loses ids, replica and start_unix_ms. A bad
// line is a *workload.LineError naming its file and line; lines before
// it have been written.
func Merge(ctx context.Context, w io.Writer, paths []string, open Open, o MergeOptions) (MergeStats, error) {
	if o.MaxIDs <= 0 {
		o.MaxIDs = DefaultMaxIDs
	}
	if o.Note == nil {
		o.Note = func(string) {}
	}
	if open == nil {
		open = workload.Open
	}
	if len(paths) > MaxFiles {
		return MergeStats{}, fmt.Errorf("%d files: at most %d at once (merge the rest, then merge the merged)", len(paths), MaxFiles)
	}
	m := &merger{ids: table[idKey]{max: o.MaxIDs}, sessions: table[sessionKey]{max: o.MaxIDs}}
	var st MergeStats
	var q queue
	var perFile []*input
	for i, p := range paths {
		r, c, err := open(p, o.MaxLineBytes)
		if err != nil {
			return st, err // names the path (os.PathError)
		}
		defer c.Close()
		in := &input{name: p, src: i, r: r, prev: -1}
		err = in.next(m)
		if errors.Is(err, io.EOF) {
			o.Note(p + ": no lines")
			continue
		}
		if err != nil {
			return st, err
		}
		in.fleet = in.req.Tokentap != nil && in.req.Tokentap.IDs == "fleet"
		if !in.fleet {
			perFile = append(perFile, in)
		}
		q = append(q, in)
	}
	// Files without a start begin with the earliest fleet file.
	var align int64
	first := true
	for _, in := range q {
		if in.fleet && (first || in.abs < align) {
			align, first = in.abs, false
		}
	}
	for _, in := range perFile {
		in.align = align
		in.abs += align
		in.prev = in.abs
		if len(q) > 1 {
			o.Note(in.name + ": hash ids numbered per file (no capture.ids: fleet): they get numbers of their own, and no sharing between them and another file's can be known; with no start_unix_ms, its first line is taken to arrive with the earliest file")
		}
	}
	heap.Init(&q)
	bw := bufio.NewWriterSize(w, 64<<10)
	base := int64(-1)
	var ids []int64
	for q.Len() > 0 {
		if st.Lines%4096 == 0 && ctx.Err() != nil {
			return st, ctx.Err()
		}
		in := q[0]
		if base < 0 {
			base = in.abs
		}
		b, err := m.encode(in, in.abs-base, &ids)
		if err != nil {
			return st, err
		}
		if _, err := bw.Write(b); err != nil {
			return st, err
		}
		st.Lines++
		switch err := in.next(m); {
		case errors.Is(err, io.EOF):
			heap.Pop(&q)
		case err != nil:
			bw.Flush()
			return st, err
		default:
			heap.Fix(&q, 0)
		}
	}
	st.Turns = m.ids.turns + m.sessions.turns
	if st.Turns > 0 {
		o.Note(fmt.Sprintf("the renumbering tables were full %d times (--max-ids %d): sharing across a turn is lost, never invented", st.Turns, o.MaxIDs))
	}
	return st, bw.Flush()
}

// encode returns in.req's merged line, at ts ms.
func (m *merger) encode(in *input, ts int64, ids *[]int64) ([]byte, error) {
	req := in.req
	src := in.src
	if in.fleet {
		src = -1
	}
	l := line{Timestamp: ts, TextInput: req.Text, Replica: req.Replica}
	if req.Text == "" || req.InputLength > 0 {
		l.InputLength = &req.InputLength
	}
	if req.HasOutputLength {
		l.OutputLength = &req.OutputLength
	}
	*ids = (*ids)[:0]
	for _, id := range req.HashIDs {
		*ids = append(*ids, m.ids.number(idKey{src, id}))
	}
	if l.InputLength != nil || len(*ids) > 0 {
		l.HashIDs = ids
	}
	if req.SessionID != "" {
		l.SessionID = strconv.FormatInt(m.sessions.number(sessionKey{src, req.SessionID}), 10)
	}
	if mt := req.Tokentap; mt != nil {
		if l.Replica == "" {
			l.Replica = mt.Replica
		}
		c := *mt
		c.IDs, c.Replica, c.StartUnixMs, c.Line = "", "", 0, 0
		l.Tokentap = &c
	}
	if l.Replica == "" {
		l.Replica = in.name
	}
	b, err := json.Marshal(&l)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// queue is a min-heap of inputs by arrival, then argument order.
type queue []*input

func (h queue) Len() int { return len(h) }
func (h queue) Less(i, j int) bool {
	if h[i].abs != h[j].abs {
		return h[i].abs < h[j].abs
	}
	return h[i].src < h[j].src
}
func (h queue) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *queue) Push(x any)   { *h = append(*h, x.(*input)) }
func (h *queue) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
