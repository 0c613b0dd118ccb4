package daemon

import (
	"context"
	"fmt"
)

// lifecycle runs the node's parts. They start in the order they were
// added, each on a context of its own, and stop the other way round: a
// part is cancelled and waited for before the part started before it is
// cancelled. So a part that others use is added first and outlives them:
// the metrics server sees the whole shutdown, the balancers keep their
// connections until the parts that feed them have stopped.
//
// The elector is not a part: Run campaigns on the lifecycle's parts and
// steps down before it stops them (the VIP goes before the balancers
// close).
type lifecycle struct {
	parts   []part
	running []*runningPart // started, in order
}

// part is one thing the node runs. start, if set, must succeed before the
// next part starts (a failure stops the parts already started); run, if
// set, runs until its context ends. Both get the part's own context.
type part struct {
	name  string
	start func(context.Context) error
	run   func(context.Context)
}

type runningPart struct {
	name   string
	cancel context.CancelFunc
	done   chan struct{}
}

// add appends a part that runs until its context ends.
func (l *lifecycle) add(name string, run func(context.Context)) {
	l.parts = append(l.parts, part{name: name, run: run})
}

// addStart appends a part that only starts (its resources are released by
// the node's Close).
func (l *lifecycle) addStart(name string, start func(context.Context) error) {
	l.parts = append(l.parts, part{name: name, start: start})
}

// names are the parts in start order.
func (l *lifecycle) names() []string {
	out := make([]string, len(l.parts))
	for i, p := range l.parts {
		out[i] = p.name
	}
	return out
}

// start starts every part, in order. On a part's failure it stops those
// already started and returns the error, naming the part.
func (l *lifecycle) start() error {
	for _, p := range l.parts {
		ctx, cancel := context.WithCancel(context.Background())
		r := &runningPart{name: p.name, cancel: cancel, done: make(chan struct{})}
		if p.start != nil {
			if err := p.start(ctx); err != nil {
				cancel()
				l.stop()
				return fmt.Errorf("%s: %w", p.name, err)
			}
		}
		if p.run != nil {
			go func() {
				defer close(r.done)
				p.run(ctx)
			}()
		} else {
			close(r.done)
		}
		l.running = append(l.running, r)
	}
	return nil
}

// stop stops the running parts, the last started first, each waited for
// before the next. Safe to call more than once.
func (l *lifecycle) stop() {
	for i := len(l.running) - 1; i >= 0; i-- {
		r := l.running[i]
		r.cancel()
		<-r.done
	}
	l.running = nil
}
