package pgtemp

import "syscall"

// dieWithParent makes the kernel send sig to the child when this process
// dies, however it dies.
func dieWithParent(attr *syscall.SysProcAttr, sig syscall.Signal) { attr.Pdeathsig = sig }
