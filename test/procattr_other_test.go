//go:build !linux

package test

import "syscall"

func procAttr() *syscall.SysProcAttr { return nil }
