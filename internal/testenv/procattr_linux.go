package testenv

import "syscall"

// procAttr makes the kernel kill the agent if the test binary dies without
// running its cleanups (a panic, a -timeout), so no agent outlives its test.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
