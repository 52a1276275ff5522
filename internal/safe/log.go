package safe

import (
	"context"
	"log/slog"
)

// MaxLogBytes bounds the message and each string or error value of a log
// line written through Handler.
const MaxLogBytes = 4096

// Handler returns a slog.Handler that passes every record to h with its
// message and each string and error value made safe by String, at most
// MaxLogBytes each, inside groups too. Values of other kinds pass as they
// are. The sidecar's logger is built on it, so an engine's status line or
// error text, or a client's host name, cannot forge or flood log lines
// whatever call site logs it.
func Handler(h slog.Handler) slog.Handler { return handler{h} }

type handler struct{ next slog.Handler }

func (h handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h handler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, String(r.Message, MaxLogBytes), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h handler) WithAttrs(as []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(as))
	for i, a := range as {
		clean[i] = attr(a)
	}
	return handler{h.next.WithAttrs(clean)}
}

func (h handler) WithGroup(name string) slog.Handler {
	return handler{h.next.WithGroup(String(name, MaxLogBytes))}
}

// attr returns a with its key and its string or error values made safe.
func attr(a slog.Attr) slog.Attr {
	a.Key = String(a.Key, MaxLogBytes)
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		a.Value = slog.StringValue(String(v.String(), MaxLogBytes))
	case slog.KindGroup:
		g := v.Group()
		clean := make([]slog.Attr, len(g))
		for i, ga := range g {
			clean[i] = attr(ga)
		}
		a.Value = slog.GroupValue(clean...)
	case slog.KindAny:
		if err, ok := v.Any().(error); ok && err != nil {
			a.Value = slog.StringValue(String(err.Error(), MaxLogBytes))
		} else {
			a.Value = v
		}
	default:
		a.Value = v
	}
	return a
}
