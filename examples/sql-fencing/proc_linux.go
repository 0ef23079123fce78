package main

import "syscall"

// dieWithParent makes the kernel send sig to the child when the demo dies,
// however it dies, so no server (and no stopped worker A) outlives it.
func dieWithParent(sig syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: sig}
}
