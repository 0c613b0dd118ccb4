// Package kubelite is what the worker agent needs of the Kubernetes API,
// without client-go: the server and credentials of a kubeconfig or of the
// pod's service account (Client), and a follower of the API servers
// published in the kubernetes Service's EndpointSlices (APIServers), over
// plain HTTPS and JSON.
//
// client-go and the API types it registers at start-up cost a worker
// agent 8 MiB of resident memory for one list and one watch
// (bench/agent/README.md). vigil run, which needs Leases, Events and Nodes,
// keeps client-go (internal/kube) and uses APIServers through an
// http.Client client-go builds.
package kubelite

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/vigil-ha/vigil/internal/validate"
)

// validate.ErrInvalid wraps every configuration error of this package.

// ServiceAccountDir is where a pod's service-account token and CA are
// mounted.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// Client is an API server URL and an HTTP client that authenticates to it.
type Client struct {
	Server string
	HTTP   *http.Client
}

// The HTTP/2 connection is pinged when it has been silent this long, and
// given up when the ping is not answered in time: a watch on an API server
// that lost power would otherwise wait forever (client-go does the same).
const (
	pingAfter   = 30 * time.Second
	pingTimeout = 15 * time.Second
)

func newHTTPClient(tc *tls.Config, auth func(*http.Request) error) *http.Client {
	tr := &http.Transport{
		TLSClientConfig:     tc,
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		HTTP2:               &http.HTTP2Config{SendPingTimeout: pingAfter, PingTimeout: pingTimeout},
	}
	var rt http.RoundTripper = tr
	if auth != nil {
		rt = authRoundTripper{next: tr, auth: auth}
	}
	return &http.Client{Transport: rt}
}

type authRoundTripper struct {
	next http.RoundTripper
	auth func(*http.Request) error
}

func (a authRoundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if err := a.auth(r); err != nil {
		return nil, err
	}
	return a.next.RoundTrip(r)
}

// tokenFile reads a bearer token from a file, again at most once a minute:
// the kubelet rewrites a projected service-account token before it
// expires.
type tokenFile struct {
	path string

	mu     sync.Mutex
	token  string
	readAt time.Time
}

const tokenReread = time.Minute

func (t *tokenFile) get() (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.token != "" && time.Since(t.readAt) < tokenReread {
		return t.token, nil
	}
	b, err := os.ReadFile(t.path)
	if err != nil {
		if t.token != "" {
			return t.token, nil // keep the last one; the file is being replaced
		}
		return "", err
	}
	if tok := strings.TrimSpace(string(b)); tok != "" {
		t.token, t.readAt = tok, time.Now()
	}
	if t.token == "" {
		return "", fmt.Errorf("token file %s is empty", t.path)
	}
	return t.token, nil
}

func (t *tokenFile) authorize(r *http.Request) error {
	tok, err := t.get()
	if err != nil {
		return err
	}
	r.Header.Set("Authorization", "Bearer "+tok)
	return nil
}

// FromServiceAccount builds a client that authenticates with the pod's
// service-account token from dir (ServiceAccountDir) and talks to server,
// verifying its certificate against the CA in dir for serverName ("" for
// the server's own host). Unlike an in-cluster client-go config it does not
// use the Service's cluster IP: the agent must reach the API server before
// kube-proxy runs.
func FromServiceAccount(dir, server, serverName string) (*Client, error) {
	tf, caFile := filepath.Join(dir, "token"), filepath.Join(dir, "ca.crt")
	for _, f := range []string{tf, caFile} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("%w: service-account credentials: %w (is the pod's service-account token mounted?)", validate.ErrInvalid, err)
		}
	}
	pool, err := certPool(caFile, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: service account: %w", validate.ErrInvalid, err)
	}
	if _, err := url.Parse(server); err != nil {
		return nil, fmt.Errorf("%w: server %q: %w", validate.ErrInvalid, server, err)
	}
	tok := &tokenFile{path: tf}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: serverName}
	return &Client{Server: server, HTTP: newHTTPClient(tc, tok.authorize)}, nil
}

// kubeconfig is the part of a kubeconfig file vigil-agent reads.
type kubeconfig struct {
	CurrentContext string `json:"current-context"`
	Clusters       []struct {
		Name    string `json:"name"`
		Cluster struct {
			Server        string `json:"server"`
			CA            string `json:"certificate-authority"`
			CAData        []byte `json:"certificate-authority-data"`
			Insecure      bool   `json:"insecure-skip-tls-verify"`
			TLSServerName string `json:"tls-server-name"`
			ProxyURL      string `json:"proxy-url"`
		} `json:"cluster"`
	} `json:"clusters"`
	Users []struct {
		Name string `json:"name"`
		User struct {
			ClientCert     string         `json:"client-certificate"`
			ClientCertData []byte         `json:"client-certificate-data"`
			ClientKey      string         `json:"client-key"`
			ClientKeyData  []byte         `json:"client-key-data"`
			Token          string         `json:"token"`
			TokenFile      string         `json:"tokenFile"`
			Username       string         `json:"username"`
			Exec           map[string]any `json:"exec"`
			AuthProvider   map[string]any `json:"auth-provider"`
		} `json:"user"`
	} `json:"users"`
	Contexts []struct {
		Name    string `json:"name"`
		Context struct {
			Cluster string `json:"cluster"`
			User    string `json:"user"`
		} `json:"context"`
	} `json:"contexts"`
}

// FromKubeconfig builds a client from a kubeconfig file's current context:
// its server, CA (file or data, or insecure-skip-tls-verify), tls-server-name,
// and a client certificate (files, read again when they change, or data),
// a token or a token file. Relative file names are relative to the
// kubeconfig's directory, as in kubectl. Exec plugins, auth providers,
// basic auth and proxies are refused with an error that says so: a worker's
// kubelet.conf or a service account is what the agent is given.
func FromKubeconfig(path string) (*Client, error) {
	c, err := fromKubeconfig(path)
	if err != nil {
		return nil, fmt.Errorf("%w: `kubeconfig` %s: %w", validate.ErrInvalid, path, err)
	}
	return c, nil
}

func fromKubeconfig(path string) (*Client, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(b, &kc); err != nil {
		return nil, err
	}
	if kc.CurrentContext == "" {
		return nil, errors.New("no current-context")
	}
	rel := func(f string) string {
		if f == "" || filepath.IsAbs(f) {
			return f
		}
		return filepath.Join(filepath.Dir(path), f)
	}
	var clusterName, userName string
	found := false
	for _, c := range kc.Contexts {
		if c.Name == kc.CurrentContext {
			clusterName, userName, found = c.Context.Cluster, c.Context.User, true
		}
	}
	if !found {
		return nil, fmt.Errorf("current-context %q is not among the contexts", kc.CurrentContext)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	server := ""
	found = false
	for _, c := range kc.Clusters {
		if c.Name != clusterName {
			continue
		}
		found = true
		cl := c.Cluster
		if cl.ProxyURL != "" {
			return nil, fmt.Errorf("cluster %q: proxy-url is not supported by vigil-agent", clusterName)
		}
		u, err := url.Parse(cl.Server)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return nil, fmt.Errorf("cluster %q: server %q: want https://HOST[:PORT]", clusterName, cl.Server)
		}
		server = strings.TrimSuffix(cl.Server, "/")
		tc.ServerName = cl.TLSServerName
		switch {
		case cl.Insecure:
			tc.InsecureSkipVerify = true
		case cl.CA != "" || len(cl.CAData) > 0:
			if tc.RootCAs, err = certPool(rel(cl.CA), cl.CAData); err != nil {
				return nil, fmt.Errorf("cluster %q: %w", clusterName, err)
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("cluster %q of context %q not found", clusterName, kc.CurrentContext)
	}
	var auth func(*http.Request) error
	found = userName == ""
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		found = true
		us := u.User
		switch {
		case us.Exec != nil, us.AuthProvider != nil:
			return nil, fmt.Errorf("user %q: exec plugins and auth providers are not supported by the agent: give it a kubeconfig with a client certificate or a token (a node's kubelet.conf has one)", userName)
		case us.Username != "":
			return nil, fmt.Errorf("user %q: basic authentication is not supported", userName)
		}
		switch {
		case us.ClientCert != "" || us.ClientKey != "":
			get, err := validate.ClientCertificate(rel(us.ClientCert), rel(us.ClientKey))
			if err != nil {
				return nil, fmt.Errorf("user %q: client certificate: %w", userName, err)
			}
			tc.GetClientCertificate = get
		case len(us.ClientCertData) > 0 || len(us.ClientKeyData) > 0:
			pair, err := tls.X509KeyPair(us.ClientCertData, us.ClientKeyData)
			if err != nil {
				return nil, fmt.Errorf("user %q: client-certificate-data: %w", userName, err)
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		switch {
		case us.Token != "":
			tok := us.Token
			auth = func(r *http.Request) error { r.Header.Set("Authorization", "Bearer "+tok); return nil }
		case us.TokenFile != "":
			auth = (&tokenFile{path: rel(us.TokenFile)}).authorize
		}
	}
	if !found {
		return nil, fmt.Errorf("user %q of context %q not found", userName, kc.CurrentContext)
	}
	return &Client{Server: server, HTTP: newHTTPClient(tc, auth)}, nil
}

func certPool(file string, data []byte) (*x509.CertPool, error) {
	if len(data) == 0 {
		var err error
		if data, err = os.ReadFile(file); err != nil {
			return nil, fmt.Errorf("certificate authority: %w", err)
		}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, errors.New("certificate authority: no PEM certificate in it")
	}
	return pool, nil
}
