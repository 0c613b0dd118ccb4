package main

import (
	"log/slog"

	"k8s.io/klog/v2"

	"github.com/vigil-ha/vigil/internal/observe"
)

// newLogger builds the process's logger (observe.NewLogger) and routes
// klog, which client-go logs through, into it: one format on stderr, and
// --log-level applies to client-go's lines too.
func newLogger(level, format string) (*slog.Logger, error) {
	log, err := observe.NewLogger(level, format)
	if err != nil {
		return nil, err
	}
	klog.SetSlogLogger(log)
	return log, nil
}
