package observe

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// NewLogger builds a process's logger, on stderr, from --log-level and
// --log-format.
func NewLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("`logLevel` %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, errors.New("`logFormat` must be text or json")
}
