package lab

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"time"

	"github.com/vishvananda/netns"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// inNS runs fn on a thread switched into namespace ns. Sockets created by fn
// belong to ns for their whole life, whichever thread uses them later.
func inNS(ns string, fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("current netns: %w", err)
	}
	defer orig.Close()
	target, err := netns.GetFromName(ns)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open netns %s: %w", ns, err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns %s: %w", ns, err)
	}
	ferr := fn()
	if err := netns.Set(orig); err != nil {
		// Leave the thread locked: the runtime then retires it rather than
		// reuse a thread stuck in the wrong namespace.
		return fmt.Errorf("leave netns %s: %w", ns, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// dialIn returns a dialer whose connections start in namespace ns.
func dialIn(ns string) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNS(ns, func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, "tcp", addr)
			return err
		})
		return c, err
	}
}

// etcdClient returns a client for the lab's etcd that connects from the
// client namespace.
func etcdClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          2 * time.Second,
		DialKeepAliveTime:    time.Second,
		DialKeepAliveTimeout: time.Second,
		DialOptions:          []grpc.DialOption{grpc.WithContextDialer(dialIn(clientNS))},
		Logger:               zap.NewNop(),
	})
}
