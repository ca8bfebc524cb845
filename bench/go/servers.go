package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"time"
)

// server is a redis-server of the bench's own: a free port, no persistence, a temp dir.
type server struct {
	cmd  *exec.Cmd
	port int
	dir  string
	URL  string
	Addr string
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startOnce(port int, dir string) (*exec.Cmd, error) {
	cmd := exec.Command("redis-server", "--port", fmt.Sprint(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		seen := false
		for sc.Scan() {
			if !seen && strings.Contains(sc.Text(), "Ready to accept connections") {
				seen = true
				ready <- true
			}
		}
		if !seen {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		if ok {
			return cmd, nil
		}
	case <-time.After(20 * time.Second):
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	return nil, fmt.Errorf("redis-server on port %d did not start", port)
}

func startServer() (*server, error) {
	dir, err := os.MkdirTemp("", "ferrolock-bench-go-")
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err == nil {
			var cmd *exec.Cmd
			if cmd, err = startOnce(port, dir); err == nil {
				addr := fmt.Sprintf("127.0.0.1:%d", port)
				return &server{cmd: cmd, port: port, dir: dir, URL: "redis://" + addr, Addr: addr}, nil
			}
		}
		// Another process may have taken the port between the pick and the bind.
		if attempt >= 5 {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

func (s *server) stop() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	os.RemoveAll(s.dir)
}

// startServers starts n servers; on failure it stops those already started.
func startServers(n int) ([]*server, error) {
	var all []*server
	for i := 0; i < n; i++ {
		s, err := startServer()
		if err != nil {
			stopAll(all)
			return nil, err
		}
		all = append(all, s)
	}
	return all, nil
}

func stopAll(all []*server) {
	for _, s := range all {
		s.stop()
	}
}

func urls(all []*server) []string {
	var u []string
	for _, s := range all {
		u = append(u, s.URL)
	}
	return u
}
