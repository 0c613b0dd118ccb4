// Package validate holds the input rules that several commands share, so
// that `vigil run`, `vigil agent`, `vigil members` and `vigil manifest`
// accept and refuse the same things, with the same words. Each function
// returns an error that names the bad value and shows a good one; callers
// mark it as invalid configuration (Invalid, ErrInvalid: the one sentinel
// of the tree) and name the flag.
package validate

import (
	"errors"
	"fmt"
	"net/url"
)

// EtcdEndpoint checks one etcd client URL: http or https, a host and a
// port (etcd has no default port a client could assume), and nothing else.
func EtcdEndpoint(s string) error {
	if err := hostPortURL(s, "http", "https"); err != nil {
		return fmt.Errorf("etcd endpoint %q must look like https://HOST:PORT, such as https://10.0.0.11:2379 (%w)", s, err)
	}
	return nil
}

// EtcdEndpoints checks a list of etcd client URLs: at least one, each
// valid, and all with the same scheme (one client either speaks TLS or
// does not).
func EtcdEndpoints(eps []string) error {
	if len(eps) == 0 {
		return errors.New("no etcd endpoints")
	}
	var scheme string
	for _, ep := range eps {
		if err := EtcdEndpoint(ep); err != nil {
			return err
		}
		u, _ := url.Parse(ep)
		if scheme != "" && u.Scheme != scheme {
			return fmt.Errorf("etcd endpoints mix http and https (%s)", ep)
		}
		scheme = u.Scheme
	}
	return nil
}

// PeerURL checks an etcd peer URL: http or https, a host and a port.
func PeerURL(s string) error {
	if err := hostPortURL(s, "http", "https"); err != nil {
		return fmt.Errorf("peer URL %q must look like https://HOST:2380 (%w)", s, err)
	}
	return nil
}

// APIServerURL checks a kube-apiserver URL: https and a host; the port may
// be left out (443).
func APIServerURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
	case u.Scheme != "https":
		err = errors.New("the scheme must be https")
	case u.Hostname() == "":
		err = errors.New("no host")
	case u.Path != "" && u.Path != "/", u.RawQuery != "", u.User != nil:
		err = errors.New("nothing may follow HOST:PORT")
	}
	if err != nil {
		return fmt.Errorf("%q must be an https URL such as https://10.0.0.100:6443 (%w)", s, err)
	}
	return nil
}

// hostPortURL checks that s is scheme://HOST:PORT with one of schemes.
func hostPortURL(s string, schemes ...string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	ok := false
	for _, sc := range schemes {
		ok = ok || u.Scheme == sc
	}
	switch {
	case !ok:
		return fmt.Errorf("scheme %q is not one of %v", u.Scheme, schemes)
	case u.Hostname() == "":
		return errors.New("no host")
	case u.Port() == "":
		return errors.New("no port")
	case u.Path != "" && u.Path != "/", u.RawQuery != "", u.User != nil:
		return errors.New("nothing may follow HOST:PORT")
	}
	return nil
}

// ErrInvalid is the one sentinel of invalid configuration, in every
// package: errors.Is(err, ErrInvalid) tells a setting that is wrong (the
// command exits at once, nothing half-configured) from a failure at run
// time.
var ErrInvalid = errors.New("invalid configuration")

// Invalid marks err as invalid configuration, once: an error that already
// is one is returned as it is, so a message never says it twice.
func Invalid(err error) error {
	if err == nil || errors.Is(err, ErrInvalid) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrInvalid, err)
}
