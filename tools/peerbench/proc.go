package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// clockTick is the unit of utime and stime in /proc/PID/stat: USER_HZ,
// 100 on Linux for every architecture Go supports here.
const clockTick = 10 * time.Millisecond

// tree returns pid and its descendants (nginx's workers, haproxy's
// threads are in pid itself).
func tree(pid int) []int {
	parent := map[int]int{}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		p, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if f := statFields(p); len(f) > 2 {
			pp, _ := strconv.Atoi(string(f[1]))
			parent[p] = pp
		}
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		for p, pp := range parent {
			if pp == out[i] {
				out = append(out, p)
			}
		}
	}
	return out
}

// statFields returns the fields of /proc/PID/stat after the command name
// (state first), or nil.
func statFields(pid int) [][]byte {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return bytes.Fields(b[i+1:])
}

// cpuTime is the user+system CPU time of pid and its descendants.
func cpuTime(pid int) time.Duration {
	var ticks int64
	for _, p := range tree(pid) {
		f := statFields(p)
		if len(f) < 13 {
			continue
		}
		// utime and stime are fields 14 and 15 of stat: 12 and 13 after
		// the name, counting the state as 1.
		u, _ := strconv.ParseInt(string(f[11]), 10, 64)
		s, _ := strconv.ParseInt(string(f[12]), 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * clockTick
}

// rssKiB is the resident set of pid and its descendants, in KiB.
func rssKiB(pid int) int64 {
	var kib int64
	for _, p := range tree(pid) {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "status"))
		if err != nil {
			continue
		}
		for line := range bytes.SplitSeq(b, []byte("\n")) {
			if v, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
				f := bytes.Fields(v)
				if len(f) > 0 {
					n, _ := strconv.ParseInt(string(f[0]), 10, 64)
					kib += n
				}
			}
		}
	}
	return kib
}
