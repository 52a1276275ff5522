//go:build unix

package record

import (
	"os"
	"syscall"
)

// links returns a file's link count (st_nlink), and whether fstat told
// it.
func links(fi os.FileInfo) (uint64, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return uint64(st.Nlink), true
}
