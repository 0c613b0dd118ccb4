package observe

import (
	"context"
	"log/slog"
	"time"

	sd "github.com/coreos/go-systemd/v22/daemon"
)

// Systemd speaks systemd's notify protocol when the process runs in a
// Type=notify unit (NOTIFY_SOCKET set); otherwise it returns at once.
//   - READY=1 now: the caller has opened its listeners and started its
//     loops (vigil run does not wait for etcd, which may start after it).
//   - WATCHDOG=1 every half WatchdogSec, while live passes (nil: always).
//     A stuck process stops pinging and systemd restarts it.
//   - STOPPING=1 when ctx ends.
func Systemd(ctx context.Context, live func(time.Time) error, log *slog.Logger) {
	sent, err := sd.SdNotify(false, sd.SdNotifyReady)
	if err != nil {
		log.Warn("cannot notify systemd", "err", err)
	}
	if !sent {
		return // not under systemd's notify
	}
	log.Info("told systemd the service is ready")
	defer func() { _, _ = sd.SdNotify(false, sd.SdNotifyStopping) }()
	every, err := sd.SdWatchdogEnabled(false)
	if err != nil || every <= 0 {
		<-ctx.Done()
		return
	}
	t := time.NewTicker(every / 2)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if live != nil {
				if err := live(now); err != nil {
					if !failing {
						log.Error("not pinging systemd's watchdog: the process is stuck, and systemd will restart it", "err", err, "watchdog", every)
						failing = true
					}
					continue
				}
			}
			failing = false
			_, _ = sd.SdNotify(false, sd.SdNotifyWatchdog)
		}
	}
}
