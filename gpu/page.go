package gpu

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"unicode/utf8"
)

// DefaultDCGMMaxBytes bounds one exporter page when energy.dcgm.max_bytes
// is 0. A node's page is tens of KiB per GPU (about 9 KiB for the
// default counters; a few hundred KiB for 8 GPUs with MIG and the
// profiling fields), so 4 MiB is ample for a real one.
const DefaultDCGMMaxBytes = 4 << 20

// maxLine bounds one line of a series the DCGM source reads; a longer
// one is refused (dcgm_malformed). Lines of other series are skipped
// whatever their length, a buffer at a time.
const maxLine = 64 << 10

// maxLabel bounds the label values kept (UUID, modelName, gpu, pod,
// namespace): they become label values of our own series.
const maxLabel = 256

// maxDCGMGPUs bounds the GPUs one page may name for this pod (a node has
// at most a few dozen): a page naming more is refused (dcgm_too_many_gpus).
const maxDCGMGPUs = 256

// errPageTooLarge is wrapped by scanPage's error when the page runs past
// its bound (a page that never ends runs past it too, or past the
// scrape's timeout).
var errPageTooLarge = errors.New("exporter page over its size bound (energy.dcgm.max_bytes)")

// pageLine is one line of a series the source reads, with only the
// labels it uses, unescaped. name is one of the dcgm* constants; value
// is the line's text, judged by the caller. The byte slices point into
// the line or into buf and are valid until the next line: nothing is
// allocated for a line the caller does not keep.
type pageLine struct {
	name                             string
	uuid, gpu, model, pod, namespace []byte
	value                            []byte
	buf                              []byte // unescaped label values, cap maxLine
}

// wanted returns the constant a series name is, or "" for a series the
// source does not read. The conversion in the switch does not allocate.
func wanted(name []byte) string {
	switch string(name) {
	case dcgmEnergy:
		return dcgmEnergy
	case dcgmPower:
		return dcgmPower
	case dcgmUtil:
		return dcgmUtil
	case dcgmFBUsed:
		return dcgmFBUsed
	case dcgmSMClock:
		return dcgmSMClock
	case dcgmMemClock:
		return dcgmMemClock
	case dcgmTemp:
		return dcgmTemp
	}
	return ""
}

// scanPage reads a Prometheus text exposition (the format dcgm-exporter
// serves) from r as it arrives, at most max bytes of it, and calls each
// for every line of a series the source reads. Nothing else of the page
// is kept: memory is one line buffer (maxLine) whatever the page's size.
// A line of a read series that cannot be parsed is passed to bad (with
// the series' name, when it got that far) and the scan goes on. The
// error is r's (a timeout, a reset) or one wrapping errPageTooLarge.
func scanPage(r io.Reader, max int64, each func(*pageLine), bad func(name string, err error)) error {
	max = min(max, math.MaxInt64-1)
	lr := &io.LimitedReader{R: r, N: max + 1}
	br := bufio.NewReaderSize(lr, maxLine)
	s := pageLine{buf: make([]byte, 0, maxLine)}
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A line over maxLine: refused if it is a read series,
			// skipped either way, a buffer at a time.
			if name := wanted(seriesName(line)); name != "" {
				bad(name, fmt.Errorf("line over %d bytes", maxLine))
			}
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			if err == nil {
				continue
			}
			line = nil
		}
		if len(line) > 0 {
			if perr := parseLine(line, &s); perr != nil {
				bad(s.name, perr)
			} else if s.name != "" {
				each(&s)
			}
		}
		switch {
		case err == nil:
		case lr.N <= 0:
			return fmt.Errorf("%w: more than %d bytes", errPageTooLarge, max)
		case errors.Is(err, io.EOF):
			return nil
		default:
			return err
		}
	}
}

// seriesName is the name at the start of a sample line: up to the first
// '{', space or tab.
func seriesName(line []byte) []byte {
	if i := bytes.IndexAny(line, "{ \t\r\n"); i >= 0 {
		return line[:i]
	}
	return line
}

// parseLine parses one line of the text format into s: s.name is "" for
// a comment, a blank line or a series the source does not read (nothing
// else parsed), else the series' constant with its kept labels and value
// text. A malformed line of a read series returns an error.
func parseLine(line []byte, s *pageLine) error {
	*s = pageLine{buf: s.buf[:0]}
	line = bytes.TrimRight(line, "\r\n")
	line = bytes.TrimLeft(line, " \t")
	if len(line) == 0 || line[0] == '#' {
		return nil
	}
	name := seriesName(line)
	if s.name = wanted(name); s.name == "" {
		return nil
	}
	rest := bytes.TrimLeft(line[len(name):], " \t")
	if len(rest) > 0 && rest[0] == '{' {
		var err error
		if rest, err = parseLabels(rest[1:], s); err != nil {
			return err
		}
	}
	rest = bytes.TrimLeft(rest, " \t")
	end := bytes.IndexAny(rest, " \t")
	if end < 0 {
		end = len(rest)
	}
	if end == 0 {
		return errors.New("no value")
	}
	s.value = rest[:end]
	if ts := bytes.TrimSpace(rest[end:]); len(ts) > 0 {
		if _, err := strconv.ParseInt(string(ts), 10, 64); err != nil {
			return fmt.Errorf("timestamp %q is not an integer", clip(ts))
		}
	}
	return nil
}

// parseLabels parses label pairs up to and past the closing '}' and
// returns what follows. Values are unescaped (\\, \", \n); only the
// labels the source uses are kept, each valid UTF-8 of at most maxLabel
// bytes.
func parseLabels(p []byte, s *pageLine) ([]byte, error) {
	for {
		p = bytes.TrimLeft(p, " \t")
		if len(p) == 0 {
			return nil, errors.New("unterminated label set")
		}
		if p[0] == '}' {
			return p[1:], nil
		}
		eq := bytes.IndexByte(p, '=')
		if eq <= 0 {
			return nil, errors.New("label without '='")
		}
		key := bytes.TrimSpace(p[:eq])
		p = bytes.TrimLeft(p[eq+1:], " \t")
		if len(p) == 0 || p[0] != '"' {
			return nil, fmt.Errorf("label %q: value not quoted", clip(key))
		}
		p = p[1:]
		// The value: the line's own bytes, or unescaped (\\, \", \n)
		// into buf, which holds at most the line and so never grows.
		end := bytes.IndexAny(p, `"\`)
		if end < 0 {
			return nil, fmt.Errorf("label %q: unterminated value", clip(key))
		}
		val := p[:end]
		if p[end] == '\\' {
			start := len(s.buf)
			s.buf = append(s.buf, p[:end]...)
			for end < len(p) && p[end] != '"' {
				c := p[end]
				if c == '\\' {
					if end++; end == len(p) {
						break
					}
					switch p[end] {
					case 'n':
						c = '\n'
					case '\\', '"':
						c = p[end]
					default:
						return nil, fmt.Errorf("label %q: bad escape \\%c", clip(key), p[end])
					}
				}
				s.buf = append(s.buf, c)
				end++
			}
			if end == len(p) {
				return nil, fmt.Errorf("label %q: unterminated value", clip(key))
			}
			val = s.buf[start:len(s.buf):len(s.buf)]
		}
		p = p[end+1:]
		var dst *[]byte
		switch string(key) {
		case "UUID":
			dst = &s.uuid
		case "gpu":
			dst = &s.gpu
		case "modelName":
			dst = &s.model
		case "pod":
			dst = &s.pod
		case "namespace":
			dst = &s.namespace
		}
		if dst != nil {
			if len(val) > maxLabel || !utf8.Valid(val) {
				return nil, fmt.Errorf("label %q: value over %d bytes or not UTF-8", key, maxLabel)
			}
			*dst = val
		}
		p = bytes.TrimLeft(p, " \t")
		if len(p) > 0 && p[0] == ',' {
			p = p[1:]
		} else if len(p) == 0 || p[0] != '}' {
			return nil, errors.New("labels not separated by ','")
		}
	}
}

// clip shortens what an error quotes from the page.
func clip(b []byte) string {
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}
