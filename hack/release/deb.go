package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
	"github.com/goreleaser/nfpm/v2/files"
)

// pkg is what differs between the two packages.
type pkg struct {
	configFile  string // the package's configuration file, a conffile
	description string
}

var packages = map[string]pkg{
	"vigil": {
		configFile: "/etc/vigil/config.yaml",
		description: `the control plane's virtual IP and load balancer
 vigil keeps a Kubernetes control plane reachable: a virtual IP elected on
 etcd or a Lease, announced by ARP, NDP or BGP, and a health-checked L4
 load balancer across the healthy kube-apiservers. It also makes etcd
 membership changes safe (vigil members). The unit vigil.service runs
 vigil run with /etc/vigil/config.yaml; set the VIP and the node's name
 there or in /etc/default/vigil, then: systemctl enable --now vigil.`,
	},
	"vigil-agent": {
		configFile: "/etc/vigil/agent.yaml",
		description: `stable local endpoints for the API server and etcd on a worker
 vigil-agent gives a worker's kubelet and etcd clients local endpoints
 that follow the control plane as it changes, so that no worker is
 templated with the list of control-plane nodes. The unit
 vigil-agent.service runs it with /etc/vigil/agent.yaml; set the server
 there or in /etc/default/vigil-agent, then:
 systemctl enable --now vigil-agent.`,
	},
}

// deb writes cmd's package for arch into the dist directory, named as
// Debian names packages: <name>_<version>_<arch>.deb.
func (r *release) deb(cmd, arch, bin string) error {
	p := packages[cmd]
	tmp, err := os.MkdirTemp("", "vigil-release-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	// The unit in deploy/systemd runs /usr/local/bin/<cmd>, where a hand
	// install puts it; a package installs into /usr/bin.
	unit, err := os.ReadFile(filepath.Join(r.root, "deploy", "systemd", cmd+".service"))
	if err != nil {
		return err
	}
	unit = bytes.ReplaceAll(unit, []byte("/usr/local/bin/"), []byte("/usr/bin/"))
	written := map[string][]byte{
		"unit":     unit,
		"config":   r.defaults[cmd],
		"default":  r.env[cmd],
		"postinst": []byte(script(postinst, cmd)),
		"prerm":    []byte(script(prerm, cmd)),
		"postrm":   []byte(script(postrm, cmd)),
	}
	for name, b := range written {
		if err := os.WriteFile(filepath.Join(tmp, name), b, 0o644); err != nil {
			return err
		}
	}
	file := func(mode os.FileMode) *files.ContentFileInfo {
		return &files.ContentFileInfo{Owner: "root", Group: "root", Mode: mode, MTime: r.mtime}
	}
	info := &nfpm.Info{
		Name:          cmd,
		Arch:          arch,
		Platform:      "linux",
		Version:       r.version,
		VersionSchema: "none",
		Section:       "net",
		Priority:      "optional",
		Maintainer:    "vigil developers <vigil@vigil-ha.dev>",
		Description:   p.description,
		Homepage:      "https://github.com/vigil-ha/vigil",
		MTime:         r.mtime,
		Overridables: nfpm.Overridables{
			Umask: 0o022,
			Contents: files.Contents{
				{Source: bin, Destination: "/usr/bin/" + cmd, FileInfo: file(0o755)},
				{Source: filepath.Join(tmp, "unit"), Destination: "/lib/systemd/system/" + cmd + ".service", FileInfo: file(0o644)},
				{Source: filepath.Join(tmp, "config"), Destination: p.configFile, Type: files.TypeConfigNoReplace, FileInfo: file(0o644)},
				{Source: filepath.Join(tmp, "default"), Destination: "/etc/default/" + cmd, Type: files.TypeConfigNoReplace, FileInfo: file(0o644)},
			},
			Scripts: nfpm.Scripts{
				PostInstall: filepath.Join(tmp, "postinst"),
				PreRemove:   filepath.Join(tmp, "prerm"),
				PostRemove:  filepath.Join(tmp, "postrm"),
			},
			Deb: nfpm.Deb{Compression: "gzip"},
		},
	}
	info = nfpm.WithDefaults(info)
	if err := nfpm.Validate(info); err != nil {
		return err
	}
	out, err := os.Create(filepath.Join(r.dist, fmt.Sprintf("%s_%s_%s.deb", cmd, r.version, arch)))
	if err != nil {
		return err
	}
	if err := deb.Default.Package(info, out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// The maintainer scripts. Installing a package does not enable or start
// its unit: vigil needs a VIP and a node name, the agent a server, before
// either can run. An upgrade does not restart a running vigil either: on a
// control plane, restarts are the operator's to order (one node at a time,
// docs/operations.md); the script says so.
const postinst = `#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
	if [ -n "$2" ] && systemctl is-active --quiet @UNIT@; then
		echo "@UNIT@ runs the previous version until it is restarted: systemctl restart @UNIT@ (one node at a time)"
	fi
fi
exit 0
`

const prerm = `#!/bin/sh
set -e
if [ "$1" = remove ]; then
	if [ -d /run/systemd/system ]; then
		systemctl stop @UNIT@ || true
	fi
	# Enabled or not: leave no link in /etc/systemd/system behind.
	systemctl disable --quiet @UNIT@ 2>/dev/null || true
fi
exit 0
`

const postrm = `#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
if [ "$1" = purge ]; then
	rm -rf /var/lib/@NAME@
fi
exit 0
`

func script(text, cmd string) string {
	return strings.NewReplacer("@UNIT@", cmd+".service", "@NAME@", cmd).Replace(text)
}
