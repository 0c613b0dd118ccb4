package validate

import (
	"errors"
	"strings"
	"testing"
)

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

func TestListenAddresses(t *testing.T) {
	for _, tc := range []struct {
		s            string
		optional, ok bool
		lokay        bool
	}{
		{s: "127.0.0.1:9558", ok: true, lokay: true},
		{s: ":9558", ok: true, lokay: false},
		{s: "[::1]:6443", ok: true, lokay: true},
		{s: "", optional: true, ok: true, lokay: false},
		{s: "", ok: false, lokay: false},
		{s: "127.0.0.1", ok: false, lokay: false},
		{s: "127.0.0.1:70000", ok: false, lokay: false},
		{s: "127.0.0.1:http", ok: false, lokay: false},
	} {
		err := ListenAddress("--x", tc.s, tc.optional)
		if (err == nil) != tc.ok {
			t.Errorf("ListenAddress(%q, optional=%v) = %v, want ok=%v", tc.s, tc.optional, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--x") {
			t.Errorf("ListenAddress(%q) = %v, does not name the flag", tc.s, err)
		}
		if err := LocalEndpoint("--y", tc.s); (err == nil) != tc.lokay {
			t.Errorf("LocalEndpoint(%q) = %v, want ok=%v", tc.s, err, tc.lokay)
		}
	}
}

func TestLBPortAndPortCheck(t *testing.T) {
	for v, want := range map[string][2]int{"6443": {6443, 0}, "8443:6443": {8443, 6443}, " 9345 ": {9345, 0}} {
		p, b, err := LBPort(v)
		if err != nil || p != want[0] || b != want[1] {
			t.Errorf("LBPort(%q) = %d, %d, %v; want %v", v, p, b, err, want)
		}
	}
	for _, v := range []string{"", "0", "70000", "a", "6443:", ":6443", "6443:0", "6443:6443:1", "-1"} {
		if _, _, err := LBPort(v); err == nil {
			t.Errorf("LBPort(%q) accepted", v)
		}
	}
	if p, c, err := PortCheck("9345=/ping"); err != nil || p != 9345 || c != "/ping" {
		t.Errorf("PortCheck(9345=/ping) = %d, %q, %v", p, c, err)
	}
	for _, v := range []string{"9345", "9345=", "=tcp", "9345=http", "0=tcp", "x=tcp"} {
		if _, _, err := PortCheck(v); err == nil {
			t.Errorf("PortCheck(%q) accepted", v)
		}
	}
}

func TestInvalidSaysItOnce(t *testing.T) {
	if Invalid(nil) != nil {
		t.Fatal("Invalid(nil) is not nil")
	}
	inner := errors.New("--lb-port 0 is out of range")
	once := Invalid(inner)
	if !errors.Is(once, ErrInvalid) || !errors.Is(once, inner) || once.Error() != "invalid configuration: --lb-port 0 is out of range" {
		t.Fatalf("Invalid(inner) = %q", once)
	}
	if twice := Invalid(once); twice != once {
		t.Fatalf("Invalid of an invalid-configuration error = %q, want it unchanged", twice)
	}
}
