package lb

import (
	"io"
	"net"
	"sync"
)

// smallBuf is the buffer interactive traffic is copied through. A read that
// fills it marks the direction as bulk, which is then spliced.
const smallBuf = 16 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, smallBuf); return &b }}

// copyAdaptive copies src to dst. API server traffic is mostly small
// requests and answers, for which one read(2) and one write(2) beat the two
// splice(2) calls through a pipe that io.Copy would use; bulk transfers
// (large lists, logs, exec streams) are spliced, so their bytes never enter
// user space. The switch happens the first time a read fills the buffer.
func copyAdaptive(dst, src net.Conn) (int64, error) {
	bp := bufPool.Get().(*[]byte)
	buf := *bp
	var total int64
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			w, werr := dst.Write(buf[:n])
			total += int64(w)
			if werr != nil {
				bufPool.Put(bp)
				return total, werr
			}
		}
		if rerr != nil {
			bufPool.Put(bp)
			if rerr == io.EOF {
				return total, nil
			}
			return total, rerr
		}
		if n == len(buf) {
			break
		}
	}
	bufPool.Put(bp)
	// Bulk from here on: io.Copy between two *net.TCPConn splices.
	n, err := io.Copy(dst, src)
	return total + n, err
}
