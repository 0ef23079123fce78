package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progress draws a one-line progress bar on stderr: \r-redrawn on a
// terminal, one line per finished run otherwise.
type progress struct {
	mu      sync.Mutex
	w       io.Writer
	tty     bool
	total   int
	done    int
	label   string
	runLen  time.Duration
	runAt   time.Time
	started time.Time
	stop    chan struct{}
	wg      sync.WaitGroup
}

func newProgress(total int) *progress {
	p := &progress{w: os.Stderr, total: total, started: time.Now(), stop: make(chan struct{})}
	if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		p.tty = true
	}
	p.wg.Add(1)
	go p.loop()
	return p
}

func (p *progress) loop() {
	defer p.wg.Done()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			if p.tty {
				p.mu.Lock()
				p.draw()
				p.mu.Unlock()
			}
		}
	}
}

func (p *progress) draw() {
	frac := float64(p.done) / float64(max(p.total, 1))
	if p.label != "" && p.runLen > 0 {
		f := min(time.Since(p.runAt).Seconds()/p.runLen.Seconds(), 1)
		frac += f / float64(max(p.total, 1))
	}
	const width = 30
	n := int(frac * width)
	bar := strings.Repeat("#", n) + strings.Repeat(".", width-n)
	fmt.Fprintf(p.w, "\r[%s] %3.0f%% run %d/%d %-28s %s ", bar, frac*100, min(p.done+1, p.total), p.total,
		p.label, time.Since(p.started).Round(time.Second))
}

func (p *progress) startRun(label string, d time.Duration) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.label, p.runLen, p.runAt = label, d, time.Now()
}

func (p *progress) endRun() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	if !p.tty {
		fmt.Fprintf(p.w, "[%d/%d] %s done (%s)\n", p.done, p.total, p.label, time.Since(p.started).Round(time.Second))
	}
	p.label = ""
}

// note prints a line without breaking the bar.
func (p *progress) note(format string, args ...any) {
	if p == nil {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprintf(p.w, "\r%-100s\r", "")
	}
	fmt.Fprintf(p.w, format+"\n", args...)
}

func (p *progress) close() {
	if p == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	if p.tty {
		p.mu.Lock()
		p.draw()
		fmt.Fprintln(p.w)
		p.mu.Unlock()
	}
}
