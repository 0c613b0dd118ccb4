package lab

import (
	"os"
	"os/exec"
	"testing"
)

// procStat counts fields from the command name's closing parenthesis, so a
// command whose name holds spaces and parentheses reads like any other;
// alive tells a running process from one that ended and was reaped.
func TestProcStatAndAlive(t *testing.T) {
	f, err := procStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if len(f) < 20 || (f[0] != "R" && f[0] != "S") {
		t.Fatalf("this process's stat fields %q: want 20 or more, state R or S", f)
	}
	if !alive(os.Getpid()) {
		t.Error("this process is not alive, says alive")
	}

	// A copy of sleep named "a (b) c": the kernel keeps the name in the
	// stat line as is.
	dir := t.TempDir()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep command")
	}
	name := dir + "/a (b) c"
	if err := os.Symlink(sleep, name); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	f, err = procStat(pid)
	if err != nil {
		_ = cmd.Process.Kill()
		t.Fatal(err)
	}
	if len(f) < 20 {
		t.Errorf("stat fields of %q: %q, want 20 or more", name, f)
	}
	if !alive(pid) {
		t.Errorf("%q is not alive, says alive", name)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if alive(pid) {
		t.Errorf("%q is alive after it was killed and reaped", name)
	}
}
