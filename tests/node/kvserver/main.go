// Command kvserver is the real-node tests' workload with data: a key-value server that keeps
// each key as a file on its volume, so a test can tell whether a replica kept its data
// through a canary, a promotion, a rollback or a fault.
//
//	PUT  /kv/<key>   store the body; 204 only once the file and its directory are fsynced
//	GET  /kv/<key>   the value, or 404
//	GET  /keys       every key this volume holds, one a line, sorted
//	GET  /id         the pod's hostname and the volume's first owner ("kv-stable-2 kv-stable-2")
//	GET  /version    the image's version (KV_VERSION)
//	GET  /ready      200 when ready; 503 for an image built never to be ready (KV_NEVER_READY)
//	                 or after POST /fail, until POST /heal
//	GET  /healthz    200 while the process runs
//	GET  /           the image's name (KV_IMAGE), as the traffic tests count answers; 500 for
//	                 an image built to fail its requests (KV_FAIL_REQUESTS)
//
// It answers the image's name over gRPC too, on the same port (grpc.go): it speaks HTTP/1.1
// and plaintext HTTP/2.
//
// The volume is KV_DATA (default /data). On first start it records the hostname in
// .owner, so a test can see a replica handed another's volume.
package main

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync/atomic"
)

var validKey = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

type server struct {
	dir      string
	version  string
	hostname string
	owner    string
	failing  atomic.Bool
}

func main() {
	dir := env("KV_DATA", "/data")
	host, _ := os.Hostname()
	s := &server{dir: dir, version: env("KV_VERSION", "unknown"), hostname: host}
	s.failing.Store(os.Getenv("KV_NEVER_READY") != "")
	if err := os.MkdirAll(filepath.Join(dir, "kv"), 0o755); err != nil {
		log.Fatalf("kvserver: the volume %s is not writable: %v", dir, err)
	}
	owner, err := os.ReadFile(filepath.Join(dir, ".owner"))
	if os.IsNotExist(err) {
		owner = []byte(host)
		if err := writeSynced(dir, ".owner", owner); err != nil {
			log.Fatalf("kvserver: recording the volume's owner: %v", err)
		}
	} else if err != nil {
		log.Fatalf("kvserver: reading the volume's owner: %v", err)
	}
	s.owner = strings.TrimSpace(string(owner))

	mux := http.NewServeMux()
	mux.HandleFunc("/kv/", s.kv)
	mux.HandleFunc("/keys", s.keys)
	mux.HandleFunc("/id", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "%s %s\n", s.hostname, s.owner)
	})
	mux.HandleFunc("/version", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, s.version)
	})
	mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		if s.failing.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	image := env("KV_IMAGE", s.version)
	failRequests := os.Getenv("KV_FAIL_REQUESTS") != ""
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		if failRequests {
			http.Error(w, image, http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, image)
	})
	mux.HandleFunc("/fail", func(w http.ResponseWriter, r *http.Request) {
		s.failing.Store(r.Method == http.MethodPost)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/heal", func(w http.ResponseWriter, _ *http.Request) {
		s.failing.Store(false)
		w.WriteHeader(http.StatusNoContent)
	})
	addr := ":" + env("KV_PORT", "8080")
	srv := &http.Server{Addr: addr, Handler: withGRPC(grpcServer(image, failRequests), mux)}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	log.Printf("kvserver %s on %s (HTTP/1.1, h2c, gRPC), data in %s (owner %s)", s.version, addr, dir, s.owner)
	log.Fatal(srv.ListenAndServe())
}

func (s *server) kv(w http.ResponseWriter, r *http.Request) {
	key := strings.TrimPrefix(r.URL.Path, "/kv/")
	if !validKey.MatchString(key) {
		http.Error(w, "a key is 1 to 128 of [A-Za-z0-9._-]", http.StatusBadRequest)
		return
	}
	switch r.Method {
	case http.MethodGet:
		b, err := os.ReadFile(filepath.Join(s.dir, "kv", key))
		if os.IsNotExist(err) {
			http.NotFound(w, r)
			return
		} else if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Write(b)
	case http.MethodPut:
		// One Read may return part of the body; a value cut short and acknowledged would be
		// a write the server never took.
		body, err := io.ReadAll(io.LimitReader(r.Body, 4097))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if len(body) > 4096 {
			http.Error(w, "a value is at most 4096 bytes", http.StatusRequestEntityTooLarge)
			return
		}
		if err := writeSynced(filepath.Join(s.dir, "kv"), key, body); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		http.Error(w, "GET or PUT", http.StatusMethodNotAllowed)
	}
}

func (s *server) keys(w http.ResponseWriter, _ *http.Request) {
	entries, err := os.ReadDir(filepath.Join(s.dir, "kv"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var names []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintln(w, n)
	}
}

// writeSynced writes dir/name through a temporary file, fsyncs it and the directory, so an
// acknowledged key survives a kill of the pod or of the node's processes.
func writeSynced(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, "."+name+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
