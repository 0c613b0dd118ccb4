// Command miniproxy is the least a goroutine-per-connection Go TCP proxy
// does: accept, dial a backend (round robin), io.Copy both ways, half-close.
// bench/lb/cpu.sh measures it beside vigil's balancer and HAProxy, to tell
// what vigil's own logic costs per connection from what Go's model costs.
//
//	miniproxy LISTEN BACKEND...
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: miniproxy LISTEN BACKEND...")
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	backends := os.Args[2:]
	var next atomic.Uint64
	for {
		c, err := ln.Accept()
		if err != nil {
			continue
		}
		go func() {
			defer c.Close()
			s, err := net.Dial("tcp", backends[next.Add(1)%uint64(len(backends))])
			if err != nil {
				return
			}
			defer s.Close()
			done := make(chan struct{})
			go func() {
				_, _ = io.Copy(s, c)
				_ = s.(*net.TCPConn).CloseWrite()
				close(done)
			}()
			_, _ = io.Copy(c, s)
			_ = c.(*net.TCPConn).CloseWrite()
			<-done
		}()
	}
}
