package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
)

// The reader accepts, line by line (docs/capture.md, "Replay"):
//
//   - tokentap's own captures: the Mooncake keys, with tokentap's fields
//     on the line (the "tokentap" member) or in the side file
//     FILE.tokentap.jsonl (one Meta per line, Meta.Line naming its entry);
//   - public Mooncake traces as AIPerf's mooncake_trace loader reads them
//     (timestamp, input_length, output_length, hash_ids; text_input in
//     place of input_length);
//   - GenAI-Perf's payload form (--input-file payload:FILE): timestamp
//     required, input_length, output_length, text_input (or text),
//     session_id (a string or a number), hash_ids, priority optional.
//
// Every other key is ignored. Timestamps are milliseconds, whole or not.

// DefaultMaxLineBytes bounds a trace line when ReaderOptions says none:
// 1 MiB holds the hash_ids of a prompt of tens of millions of tokens.
const DefaultMaxLineBytes = 1 << 20

// MaxInputLength bounds input_length: the prompt the replay synthesises
// is held in memory while it is sent (4 bytes a token: 16 MiB).
const MaxInputLength = 1 << 22

// Request is one trace line as the replay needs it.
type Request struct {
	Entry
	// Line is the 1-based line number in the trace file.
	Line int64
	// Text is the line's own prompt (text_input or text), sent as it is
	// in place of a synthesised one; "" when the line has none.
	Text string
	// HasOutputLength says the line gave output_length; without it the
	// request asks for no max_tokens.
	HasOutputLength bool
}

// LineError is a bad trace line: the file, the 1-based line and what is
// wrong with it.
type LineError struct {
	File string
	Line int64
	Err  error
}

func (e *LineError) Error() string {
	return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err)
}

func (e *LineError) Unwrap() error { return e.Err }

// Errors a LineError wraps.
var (
	ErrLineTooLong = errors.New("line too long")
	ErrTruncated   = errors.New("truncated: the last line ends without a newline and is not a whole JSON object")
	ErrDecreasing  = errors.New("timestamp decreases")
)

// ReaderOptions tune a Reader. The zero value reads with
// DefaultMaxLineBytes and names the trace "trace".
type ReaderOptions struct {
	// Name is how errors name the trace (its path).
	Name string
	// MaxLineBytes bounds a line, its newline excluded; 0 means
	// DefaultMaxLineBytes.
	MaxLineBytes int
	// Side, if set, is the side file: one Meta per line, its Line
	// naming the trace line it belongs to, in increasing order.
	Side io.Reader
}

// Reader reads a trace one line at a time: nothing but the current line
// is held, so a trace of any size streams.
type Reader struct {
	opts  ReaderOptions
	br    *bufio.Reader
	line  int64
	last  float64 // the previous entry's timestamp
	buf   []byte
	side  *Reader // the side file's lines, read as JSON Meta
	meta  *Meta   // the side file's next Meta, read ahead
	sideN int64
	err   error
}

// NewReader reads the trace from r.
func NewReader(r io.Reader, opts ReaderOptions) *Reader {
	if opts.MaxLineBytes <= 0 {
		opts.MaxLineBytes = DefaultMaxLineBytes
	}
	if opts.Name == "" {
		opts.Name = "trace"
	}
	rd := &Reader{opts: opts, br: bufio.NewReaderSize(r, 64<<10)}
	if opts.Side != nil {
		rd.side = &Reader{opts: ReaderOptions{Name: opts.Name + SideSuffix, MaxLineBytes: opts.MaxLineBytes}, br: bufio.NewReaderSize(opts.Side, 64<<10)}
	}
	return rd
}

// SideSuffix is appended to a trace's path to name its side file.
const SideSuffix = ".tokentap.jsonl"

// Open opens the trace at path and, when it exists, its side file
// (path + SideSuffix). Close the returned closer when done.
func Open(path string, maxLine int) (*Reader, io.Closer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	opts := ReaderOptions{Name: path, MaxLineBytes: maxLine}
	closers := multiCloser{f}
	if s, err := os.Open(path + SideSuffix); err == nil {
		opts.Side = s
		closers = append(closers, s)
	} else if !errors.Is(err, os.ErrNotExist) {
		f.Close()
		return nil, nil, err
	}
	return NewReader(f, opts), closers, nil
}

type multiCloser []io.Closer

func (m multiCloser) Close() error {
	var errs []error
	for _, c := range m {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// rawLine returns the next non-blank line without its newline, and
// whether it ended with one; io.EOF at the end.
func (r *Reader) rawLine() (b []byte, newline bool, err error) {
	for {
		r.buf = r.buf[:0]
		r.line++
		for {
			chunk, err := r.br.ReadSlice('\n')
			if len(r.buf)+len(chunk) > r.opts.MaxLineBytes+1 {
				r.err = &LineError{r.opts.Name, r.line, fmt.Errorf("%w: over %d bytes", ErrLineTooLong, r.opts.MaxLineBytes)}
				return nil, false, r.err
			}
			r.buf = append(r.buf, chunk...)
			if err == bufio.ErrBufferFull {
				continue
			}
			if err == io.EOF {
				if len(bytes.TrimSpace(r.buf)) == 0 {
					return nil, false, io.EOF
				}
				return r.buf, false, nil
			}
			if err != nil {
				r.err = &LineError{r.opts.Name, r.line, err}
				return nil, false, r.err
			}
			break
		}
		b = bytes.TrimSpace(r.buf)
		if len(b) > 0 {
			return b, true, nil
		}
	}
}

// line is a trace line as decoded before it is checked.
type line struct {
	Timestamp    *json.Number    `json:"timestamp"`
	InputLength  *int64          `json:"input_length"`
	OutputLength *int64          `json:"output_length"`
	HashIDs      []int64         `json:"hash_ids"`
	SessionID    json.RawMessage `json:"session_id"`
	Replica      string          `json:"replica"`
	TextInput    *string         `json:"text_input"`
	Text         *string         `json:"text"`
	Tokentap     *Meta           `json:"tokentap"`
}

// Next returns the next request, io.EOF after the last, or a
// *LineError naming the bad line; after an error, every call returns
// it again.
func (r *Reader) Next() (Request, error) {
	if r.err != nil {
		return Request{}, r.err
	}
	b, newline, err := r.rawLine()
	if err != nil {
		if err == io.EOF {
			r.err = io.EOF
		}
		return Request{}, err
	}
	req, err := r.parse(b)
	if err != nil {
		if !newline {
			err = fmt.Errorf("%w (%v)", ErrTruncated, err)
		}
		r.err = &LineError{r.opts.Name, r.line, err}
		return Request{}, r.err
	}
	if r.side != nil {
		if err := r.attach(&req); err != nil {
			r.err = err
			return Request{}, err
		}
	}
	return req, nil
}

func (r *Reader) parse(b []byte) (Request, error) {
	var l line
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&l); err != nil {
		return Request{}, fmt.Errorf("not a JSON object: %v", err)
	}
	if d.More() {
		return Request{}, errors.New("more than one JSON value on the line")
	}
	req := Request{Line: r.line}
	if l.Timestamp == nil {
		return req, errors.New("no timestamp: the replay needs each request's arrival (milliseconds since the trace's start)")
	}
	ts, err := strconv.ParseFloat(string(*l.Timestamp), 64)
	if err != nil || ts < 0 || math.IsInf(ts, 0) || ts > float64(math.MaxInt64)/1e6 {
		return req, fmt.Errorf("timestamp %s: want milliseconds, 0 or more", *l.Timestamp)
	}
	if ts < r.last {
		return req, fmt.Errorf("%w: %s after %s (a trace is in arrival order)", ErrDecreasing, *l.Timestamp, strconv.FormatFloat(r.last, 'f', -1, 64))
	}
	r.last = ts
	req.Timestamp = int64(ts)
	switch {
	case l.TextInput != nil:
		req.Text = *l.TextInput
	case l.Text != nil:
		req.Text = *l.Text
	}
	switch {
	case l.InputLength != nil:
		req.InputLength = *l.InputLength
	case req.Text == "":
		return req, errors.New("no input_length and no text_input: nothing says how long the prompt is")
	}
	if req.InputLength < 0 || req.InputLength > MaxInputLength {
		return req, fmt.Errorf("input_length %d: want 0 to %d", req.InputLength, MaxInputLength)
	}
	if l.OutputLength != nil {
		if *l.OutputLength < 0 || *l.OutputLength > math.MaxInt32 {
			return req, fmt.Errorf("output_length %d: want 0 or more", *l.OutputLength)
		}
		req.OutputLength, req.HasOutputLength = *l.OutputLength, true
	}
	for _, id := range l.HashIDs {
		if id < 0 {
			return req, fmt.Errorf("hash_ids: %d is negative", id)
		}
	}
	req.HashIDs = l.HashIDs
	if len(l.SessionID) > 0 && string(l.SessionID) != "null" {
		var s string
		if json.Unmarshal(l.SessionID, &s) != nil {
			var n json.Number
			if json.Unmarshal(l.SessionID, &n) != nil {
				return req, errors.New("session_id: want a string or a number")
			}
			s = n.String()
		}
		req.SessionID = s
	}
	req.Replica = l.Replica
	req.Tokentap = l.Tokentap
	return req, nil
}

// attach gives req the side file's Meta for its line, if there is one.
func (r *Reader) attach(req *Request) error {
	for {
		if r.meta == nil {
			b, _, err := r.side.rawLine()
			if err == io.EOF {
				r.side = nil
				return nil
			}
			if err != nil {
				return err
			}
			var m Meta
			if err := json.Unmarshal(b, &m); err != nil || m.Line < 1 {
				return &LineError{r.side.opts.Name, r.side.line, fmt.Errorf("not a tokentap line with its \"line\" (1 or more): %v", err)}
			}
			if m.Line <= r.sideN {
				return &LineError{r.side.opts.Name, r.side.line, fmt.Errorf("line %d after line %d: the side file is in the trace's order", m.Line, r.sideN)}
			}
			r.sideN = m.Line
			r.meta = &m
		}
		switch {
		case r.meta.Line < req.Line: // an entry that was not a request line: skip
			r.meta = nil
		case r.meta.Line == req.Line:
			if req.Tokentap == nil {
				req.Tokentap = r.meta
			}
			r.meta = nil
			return nil
		default:
			return nil
		}
	}
}
