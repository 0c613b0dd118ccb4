package lab

import (
	"bufio"
	"context"
	"io"
	"net"
	"strconv"
	"testing"
	"time"
)

// TestBulkBackendAndThroughput: the benchmark backend sends exactly the
// bytes asked for, all zero, from its in-memory file (more than the file
// holds, and not a multiple of it), and answers the next line after; the
// throughput load counts what it reads.
func TestBulkBackendAndThroughput(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go serveBulk(ln, "n9")

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	want := int64(2*zeroBytes + 12345)
	if _, err := io.WriteString(c, "get "+strconv.FormatInt(want, 10)+"\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	buf := make([]byte, 64<<10)
	for got := int64(0); got < want; {
		n, err := r.Read(buf[:min(int64(len(buf)), want-got)])
		for _, b := range buf[:n] {
			if b != 0 {
				t.Fatalf("byte %d of the stream is %d, want 0", got, b)
			}
		}
		got += int64(n)
		if err != nil {
			t.Fatalf("after %d of %d bytes: %v", got, want, err)
		}
	}
	if _, err := io.WriteString(c, "name\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "n9\n" {
		t.Fatalf("after the bulk: %q, %v (extra bytes or a closed connection?)", line, err)
	}

	res, err := RunLoad(context.Background(), LoadConfig{Mode: LoadThroughput, Target: ln.Addr().String(), Duration: 300 * time.Millisecond, Workers: 2})
	if err != nil || res.Errors != 0 || res.PerSecond <= 0 {
		t.Fatalf("throughput: %+v, %v", res, err)
	}
}
