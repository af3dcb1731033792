package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// ServeAPIProxy forwards TCP connections accepted on listen (in the
// caller's namespace) to target, dialled from inside the network namespace
// at nsPath: a socket belongs to the namespace it was created in, so the
// connection leaves from there. It is how the root namespace reaches a
// lab's API server without a route into the lab.
func ServeAPIProxy(ctx context.Context, listen, nsPath, target string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", listen, err)
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		go forward(c, nsPath, target)
	}
}

func forward(c net.Conn, nsPath, target string) {
	defer c.Close()
	var up net.Conn
	err := InNS(nsPath, func() error {
		var err error
		up, err = net.DialTimeout("tcp", target, 5*time.Second)
		return err
	})
	if err != nil {
		return
	}
	defer up.Close()
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}
	go pipe(up, c)
	go pipe(c, up)
	wg.Wait()
}
