package capture

import (
	"encoding/binary"
	"encoding/json"
	"strconv"
	"sync/atomic"
)

// encoder turns items into trace lines on the file's writer goroutine
// (record.FileOptions.Encode), with the state of the file being written:
// its time origin, and the tables that renumber digests and sessions to
// small consecutive integers. A new file (fresh) starts them again.
//
// Each table is bounded: it has two generations of at most maxIDs
// entries; a digest is looked up in the current one, then the old one
// (and moved to the current one); when the current one is full it
// becomes the old one and the old one is forgotten (turns counts it). A
// digest forgotten and seen again gets a new number: sharing with lines
// before the turn is lost, never invented.
//
// With fleet set, nothing is renumbered: each id is the digest's fleet
// id (fleetID), the time origin is the first arrival's whole millisecond,
// and the tokentap member begins with fleet (its "ids", "replica" and
// "start_unix_ms" members, each followed by a comma, without the start's
// value).
type encoder struct {
	maxIDs int
	meta   bool
	turns  *atomic.Uint64
	fleet  []byte

	origin       int64
	ids, oldIDs  map[digest]int64
	nextID       int64
	sess, oldSes map[digest]int64
	nextSession  int64
}

func (e *encoder) reset() {
	e.origin = -1
	e.ids, e.oldIDs, e.nextID = map[digest]int64{}, nil, 0
	e.sess, e.oldSes, e.nextSession = map[digest]int64{}, nil, 0
}

// number returns d's number in the table (cur, old), giving it the next
// one when it has none.
func (e *encoder) number(cur, old *map[digest]int64, next *int64, d digest) int64 {
	if n, ok := (*cur)[d]; ok {
		return n
	}
	n, ok := (*old)[d]
	if !ok {
		n = *next
		*next++
	}
	if len(*cur) >= e.maxIDs {
		*old, *cur = *cur, make(map[digest]int64, e.maxIDs/4)
		e.turns.Add(1)
	}
	(*cur)[d] = n
	return n
}

// encode appends the line of item (layout: Capture.line) to dst.
func (e *encoder) encode(dst, it []byte, fresh bool) []byte {
	if fresh {
		e.reset()
	}
	at := int64(binary.LittleEndian.Uint64(it))
	in := int64(binary.LittleEndian.Uint64(it[8:]))
	out := int64(binary.LittleEndian.Uint64(it[16:]))
	n := int(binary.LittleEndian.Uint32(it[24:]))
	it = it[28:]
	if e.origin < 0 {
		e.origin = at
		if e.fleet != nil {
			e.origin = at - ((at%1e6)+1e6)%1e6 // the millisecond's start
		}
	}
	dst = append(dst, `{"timestamp":`...)
	dst = strconv.AppendInt(dst, max(at-e.origin, 0)/1e6, 10)
	dst = append(dst, `,"input_length":`...)
	dst = strconv.AppendInt(dst, in, 10)
	dst = append(dst, `,"output_length":`...)
	dst = strconv.AppendInt(dst, out, 10)
	dst = append(dst, `,"hash_ids":[`...)
	for i := range n {
		if i > 0 {
			dst = append(dst, ',')
		}
		d := digest(it[i*digestBytes : (i+1)*digestBytes])
		if e.fleet != nil {
			dst = strconv.AppendInt(dst, fleetID(d), 10)
			continue
		}
		dst = strconv.AppendInt(dst, e.number(&e.ids, &e.oldIDs, &e.nextID, d), 10)
	}
	dst = append(dst, ']')
	it = it[n*digestBytes:]
	if it[0] == 1 {
		d := digest(it[1 : 1+digestBytes])
		var s int64
		if e.fleet != nil {
			s = fleetID(d)
		} else {
			s = e.number(&e.sess, &e.oldSes, &e.nextSession, d)
		}
		dst = append(dst, `,"session_id":"`...)
		dst = strconv.AppendInt(dst, s, 10)
		dst = append(dst, '"')
		it = it[1+digestBytes:]
	} else {
		it = it[1:]
	}
	switch {
	case e.meta && len(it) > 1 && e.fleet != nil:
		dst = append(dst, `,"tokentap":{`...)
		dst = append(dst, e.fleet...)
		dst = strconv.AppendInt(dst, e.origin/1e6, 10)
		dst = append(dst, ',')
		dst = append(dst, it[1:]...) // the member's own, past its '{'
	case e.meta && len(it) > 0:
		dst = append(dst, `,"tokentap":`...)
		dst = append(dst, it...)
	}
	return append(dst, "}\n"...)
}

// FleetIDBits is the size of a fleet id: the first 53 bits of the
// block's keyed digest, so that every id is an integer a JSON reader
// holds exactly in a float64 (below 2^53). Among n distinct blocks the
// expected number of colliding pairs is n(n-1)/2^54: 5.6e-5 for a
// million blocks, 0.56 for a hundred million.
const FleetIDBits = 53

// fleetID is d's fleet id: equal for equal digests, hence across every
// replica whose capture has the same secret and block bytes.
func fleetID(d digest) int64 {
	return int64(binary.BigEndian.Uint64(d[:8]) >> (64 - FleetIDBits))
}

// fleetMember is the start of a fleet line's tokentap member: its ids,
// its replica and the start's key (encoder.fleet).
func fleetMember(replica string) []byte {
	r, _ := json.Marshal(replica) // a string always marshals
	b := append([]byte(`"ids":"fleet","replica":`), r...)
	return append(b, `,"start_unix_ms":`...)
}
