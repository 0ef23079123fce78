//go:build unix && !linux

package pgtemp

import "syscall"

// dieWithParent: only Linux has a parent-death signal; elsewhere a server
// whose parent was killed keeps running until it is stopped by hand.
func dieWithParent(*syscall.SysProcAttr, syscall.Signal) {}
