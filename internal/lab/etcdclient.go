package lab

import (
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/vigil-ha/vigil/internal/netns"
)

// etcdClient returns a client for the lab's etcd that connects from the
// client namespace.
func etcdClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          2 * time.Second,
		DialKeepAliveTime:    time.Second,
		DialKeepAliveTimeout: time.Second,
		DialOptions:          []grpc.DialOption{grpc.WithContextDialer(netns.Dialer(clientNS))},
		Logger:               zap.NewNop(),
	})
}
