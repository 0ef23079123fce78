package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	hdr "github.com/HdrHistogram/hdrhistogram-go"
)

// diskMain is `lockbench disk`: the disk's floor under one Raft append, a
// small write followed by fsync (or fdatasync), timed in a loop by one or
// more writers at once, each on its own file (three members on one disk
// are three writers).
func diskMain(args []string) int {
	fs := flag.NewFlagSet("lockbench disk", flag.ContinueOnError)
	dir := fs.String("dir", os.TempDir(), "directory for the test files (lockbench's clusters keep their data under the temp dir)")
	size := fs.Int("size", 300, "bytes per write")
	n := fs.Int("n", 3000, "writes per writer")
	writersFlag := fs.String("writers", "1,3", "writer counts to measure, one after the other")
	syncFlag := fs.String("sync", "fsync,fdatasync", "sync calls to measure: fsync, fdatasync")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fmt.Printf("%d-byte write + sync, %d per writer, files in %s\n\n", *size, *n, *dir)
	fmt.Println("| sync | writers | p50 ms | p90 ms | p99 ms | max ms | appends/s (all writers) |")
	fmt.Println("|---|--:|--:|--:|--:|--:|--:|")
	for _, sc := range splitList(*syncFlag) {
		for _, w := range splitList(*writersFlag) {
			k, err := strconv.Atoi(w)
			if err != nil || k < 1 {
				fmt.Fprintf(os.Stderr, "lockbench disk: bad writer count %q\n", w)
				return 2
			}
			h, sec, err := diskRun(*dir, k, *n, *size, sc == "fdatasync")
			if err != nil {
				fmt.Fprintln(os.Stderr, "lockbench disk:", err)
				return 1
			}
			ms := func(q float64) float64 { return float64(h.ValueAtQuantile(q)) / 1000 }
			fmt.Printf("| %s | %d | %.3f | %.3f | %.3f | %.2f | %.0f |\n", sc, k, ms(50), ms(90), ms(99), float64(h.Max())/1000, float64(h.TotalCount())/sec)
		}
	}
	return 0
}

func diskRun(dir string, writers, n, size int, datasync bool) (*hdr.Histogram, float64, error) {
	all := newHist()
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, writers)
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte('a' + i%26)
	}
	t0 := time.Now()
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.CreateTemp(dir, "lockbench-disk-")
			if err != nil {
				errs[i] = err
				return
			}
			defer os.Remove(f.Name())
			defer f.Close()
			h := newHist()
			for j := 0; j < n; j++ {
				s := time.Now()
				if _, err := f.Write(buf); err != nil {
					errs[i] = err
					return
				}
				if datasync {
					err = syscall.Fdatasync(int(f.Fd()))
				} else {
					err = f.Sync()
				}
				if err != nil {
					errs[i] = err
					return
				}
				h.RecordValue(max(time.Since(s).Microseconds(), 1))
			}
			mu.Lock()
			all.Merge(h)
			mu.Unlock()
		}()
	}
	wg.Wait()
	sec := time.Since(t0).Seconds()
	for _, err := range errs {
		if err != nil {
			return nil, 0, err
		}
	}
	return all, sec, nil
}
