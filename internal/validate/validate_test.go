package validate

import "testing"

func TestEtcdEndpoints(t *testing.T) {
	good := [][]string{
		{"https://10.0.0.11:2379"},
		{"http://127.0.0.1:2379", "http://[fd00::1]:2379"},
		{"https://etcd-1.example:2379/"},
	}
	for _, eps := range good {
		if err := EtcdEndpoints(eps); err != nil {
			t.Errorf("%v refused: %v", eps, err)
		}
	}
	bad := [][]string{
		nil,
		{"10.0.0.11:2379"},
		{"https://10.0.0.11"},
		{"unix:///run/etcd.sock"},
		{"https://:2379"},
		{"https://10.0.0.11:2379/v3"},
		{"https://10.0.0.11:2379?x=1"},
		{"https://user@10.0.0.11:2379"},
		{"https://10.0.0.11:2379", "http://10.0.0.12:2379"},
		{"https://10.0.0.11:2379", "%zz"},
	}
	for _, eps := range bad {
		if err := EtcdEndpoints(eps); err == nil {
			t.Errorf("%v accepted", eps)
		}
	}
}

func TestPeerAndAPIServerURLs(t *testing.T) {
	for s, ok := range map[string]bool{
		"https://10.0.0.14:2380": true, "http://10.0.0.14:2380": true,
		"https://10.0.0.14": false, "10.0.0.14:2380": false, "https://10.0.0.14:2380/x": false,
	} {
		if err := PeerURL(s); (err == nil) != ok {
			t.Errorf("PeerURL(%q) = %v", s, err)
		}
	}
	for s, ok := range map[string]bool{
		"https://10.0.0.100:6443": true, "https://vip.example": true, "https://10.0.0.100:6443/": true,
		"http://10.0.0.100:6443": false, "https://": false, "https://10.0.0.100:6443/api": false, "10.0.0.100:6443": false,
	} {
		if err := APIServerURL(s); (err == nil) != ok {
			t.Errorf("APIServerURL(%q) = %v", s, err)
		}
	}
}
