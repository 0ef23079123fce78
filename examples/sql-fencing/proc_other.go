//go:build unix && !linux

package main

import "syscall"

// dieWithParent: only Linux can tie a child's life to its parent's; here
// the demo's own clean-up (and its signal handling) has to do.
func dieWithParent(syscall.Signal) *syscall.SysProcAttr { return nil }
