//go:build linux

package proxy

import (
	"net"
	"syscall"
	"unsafe"
)

// quiet reports whether an idle connection has nothing to read: not
// closed by its peer (a read would return 0 bytes), no error pending,
// no bytes no request asked for. It peeks without blocking.
func quiet(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	rc.Control(func(fd uintptr) {
		var b [1]byte
		_, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		ok = e == syscall.EAGAIN
	})
	return ok
}
