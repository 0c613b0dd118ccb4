package membership

import (
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil/internal/etcdtest"
)

// The reports of every format are read: vigil 0.3.0's (no format) and a
// later one's with fields this version does not know; this version
// publishes its own format.
func TestReportsOfEveryFormat(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := newCluster(t, c)
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for key, v := range map[string]string{
		DefaultReportPrefix + "old": `{"observer":"old","member":"m1","seq":7,"watchingMs":60000,"members":{"8e9e05c52164694d":{"name":"m2","reachable":false,"downMs":12000}}}`,
		DefaultReportPrefix + "new": `{"observer":"new","member":"m3","seq":2,"watchingMs":1000,"members":{},"format":2,"raftView":{"leader":"m1"}}`,
	} {
		if _, err := cli.Put(ctx(t), key, v); err != nil {
			t.Fatal(err)
		}
	}
	reports, err := cl.Reports(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Report{}
	for _, r := range reports {
		got[r.Observer] = r
	}
	if len(got) != 2 || got["old"].Seq != 7 || got["old"].Members["8e9e05c52164694d"].Down() != 12*time.Second || got["new"].Member != "m3" {
		t.Fatalf("reports %+v", reports)
	}
	if err := cl.Publish(ctx(t), Report{Observer: "this", Member: "m1", Seq: 1, Members: map[string]Sighting{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx(t), DefaultReportPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, kv := range resp.Kvs {
		if strings.Contains(string(kv.Value), `"observer":"this"`) {
			found = strings.Contains(string(kv.Value), `"format":1`)
		}
	}
	if !found {
		t.Fatalf("the published report has no format 1: %v", resp.Kvs)
	}
}
