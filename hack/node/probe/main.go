// probe: a tiny static program run as a pod on the real node by tests/e2e/test_real_node.py. It checks, from
// inside a real container, what in-cluster clients need: Service DNS (CoreDNS), the `kubernetes` ClusterIP
// (kube-proxy) with the pod's ServiceAccount token, and a writable PersistentVolume; then it exits with
// $EXIT_CODE so the test can see a chosen code in the pod's status. Results go to stdout as one JSON object.
// `probe serve` answers HTTP on :8080 with the pod's hostname: a backend for checking ClusterIP Services.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

type result struct {
	Lookups  map[string][]string `json:"lookups"`
	Fetched  map[string]string   `json:"fetched"`
	Errors   []string            `json:"errors"`
	Version  string              `json:"apiserverVersion"`
	Username string              `json:"username"`
	Wrote    string              `json:"wrote"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		name, _ := os.Hostname()
		http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, name) })
		fmt.Println(http.ListenAndServe(":8080", nil))
		os.Exit(1)
	}
	res := result{Lookups: map[string][]string{}, Fetched: map[string]string{}, Errors: []string{}}
	fail := func(format string, args ...any) { res.Errors = append(res.Errors, fmt.Sprintf(format, args...)) }

	// The pod's /etc/resolv.conf (written by the kubelet: clusterDNS + search path) is what this uses.
	resolver := &net.Resolver{PreferGo: true}
	for _, name := range strings.Fields(os.Getenv("LOOKUP")) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		addrs, err := resolver.LookupHost(ctx, name)
		cancel()
		if err != nil {
			fail("lookup %s: %v", name, err)
			continue
		}
		res.Lookups[name] = addrs
	}

	// Plain HTTP GETs through Service names: kube-proxy's DNAT to a pod on the same bridge.
	for _, url := range strings.Fields(os.Getenv("FETCH")) {
		client := &http.Client{Timeout: 10 * time.Second}
		resp, err := client.Get(url)
		if err != nil {
			fail("fetch %s: %v", url, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		res.Fetched[url] = string(body)
	}

	if err := apiserver(&res); err != nil {
		fail("apiserver: %v", err)
	}

	if path := os.Getenv("WRITE_FILE"); path != "" {
		content := []byte(os.Getenv("HOSTNAME") + "\n")
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			fail("mkdir: %v", err)
		} else if err := os.WriteFile(path, content, 0o644); err != nil {
			fail("write: %v", err)
		} else if back, err := os.ReadFile(path); err != nil || !bytes.Equal(back, content) {
			fail("read back %s: %v", path, err)
		} else {
			res.Wrote = path
		}
	}

	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	code, _ := strconv.Atoi(os.Getenv("EXIT_CODE"))
	if len(res.Errors) > 0 {
		code = 1
	}
	os.Exit(code)
}

// apiserver calls the API the way client-go's in-cluster config does: KUBERNETES_SERVICE_HOST/PORT (the
// `kubernetes` Service ClusterIP), the mounted CA and the projected ServiceAccount token.
func apiserver(res *result) error {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" {
		return fmt.Errorf("KUBERNETES_SERVICE_HOST is not set")
	}
	ca, err := os.ReadFile(filepath.Join(saDir, "ca.crt"))
	if err != nil {
		return err
	}
	token, err := os.ReadFile(filepath.Join(saDir, "token"))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	// ServerName: the serving cert names the Service's DNS names, not the ClusterIP we dial.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "kubernetes.default.svc"},
	}}
	base := "https://" + net.JoinHostPort(host, port)
	call := func(method, path string, body []byte, into any) error {
		req, err := http.NewRequest(method, base+path, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, data)
		}
		return json.Unmarshal(data, into)
	}
	var version struct {
		GitVersion string `json:"gitVersion"`
	}
	if err := call("GET", "/version", nil, &version); err != nil {
		return err
	}
	res.Version = version.GitVersion
	// SelfSubjectReview is allowed for every authenticated user: it proves the token was accepted.
	var review struct {
		Status struct {
			UserInfo struct {
				Username string `json:"username"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	body := []byte(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`)
	if err := call("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body, &review); err != nil {
		return err
	}
	res.Username = review.Status.UserInfo.Username
	return nil
}
