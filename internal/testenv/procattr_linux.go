package testenv

import "syscall"

// ProcAttr makes the kernel kill a child process if the test binary dies
// without running its cleanups (a panic, a -timeout), so no child outlives
// its test.
func ProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
