//go:build linux

package proxy

import "syscall"

// socketPair returns a connected pair of non-blocking stream sockets.
func socketPair() ([2]int, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	return [2]int(fds), err
}

func closeFDs(fds [2]int) {
	syscall.Close(fds[0])
	syscall.Close(fds[1])
}

// drainFD reads fd until it is closed.
func drainFD(fd int) {
	syscall.SetNonblock(fd, false)
	b := make([]byte, 64<<10)
	for {
		if n, err := syscall.Read(fd, b); n <= 0 || err != nil {
			return
		}
	}
}
