//go:build !linux

package testenv

import "syscall"

// ProcAttr is nil where the kernel cannot kill a child with its parent.
func ProcAttr() *syscall.SysProcAttr { return nil }
