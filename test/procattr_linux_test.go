package test

import "syscall"

// procAttr makes the kernel kill a child (hastate, HAProxy) if the test
// binary dies without running its cleanups, so none outlives its test.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
