package lab

import (
	"fmt"
	"os"
	"path/filepath"
)

// keepalivedConf renders the configuration kubeadm's HA documentation
// recommends (one MASTER at priority 101, BACKUPs at 100, 1 s adverts), or
// the tuned variant (VRRPv3, 0.1 s adverts). The documented track_script
// checks a local API server, which the lab does not run; it is left out, so
// the comparison is of failover alone.
func keepalivedConf(n *Node, tuned bool) string {
	st, prio := "BACKUP", 100
	if n.Index == 1 {
		st, prio = "MASTER", 101
	}
	global, advert := "", "1"
	if tuned {
		global, advert = "    vrrp_version 3\n", "0.1"
	}
	auth := "    authentication {\n        auth_type PASS\n        auth_pass 42\n    }\n"
	if tuned {
		auth = "" // VRRPv3 has no authentication
	}
	return fmt.Sprintf(`global_defs {
    router_id %s
%s    enable_script_security
}
vrrp_instance VI_1 {
    state %s
    interface %s
    virtual_router_id 51
    priority %d
    advert_int %s
%s    virtual_ipaddress {
        %s
    }
}
`, n.Name, global, st, nodeIface, prio, advert, auth, VIP)
}

func (l *Lab) startKeepalived(n *Node) error {
	dir := l.nodeDir(n)
	conf := filepath.Join(dir, "keepalived.conf")
	if err := os.WriteFile(conf, []byte(keepalivedConf(n, l.st.Settings.Impl == ImplKeepalivedTuned)), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", conf, err)
	}
	// A reboot empties /run; a killed keepalived leaves its pid files, and
	// a new one refuses to start if another process now has that pid.
	for _, f := range []string{"keepalived.pid", "vrrp.pid"} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("remove stale %s: %w", f, err)
		}
	}
	return l.start(n, roleKeepalived, "keepalived",
		"--dont-fork", "--log-console", "--log-detail", "--vrrp", "--no-syslog",
		"--use-file", conf,
		"--pid", filepath.Join(dir, "keepalived.pid"),
		"--vrrp_pid", filepath.Join(dir, "vrrp.pid"),
	)
}
