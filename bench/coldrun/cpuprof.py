#!/usr/bin/env python3
# cpuprof.py NAME -- CMD...: runs CMD in a new cpuacct cgroup (cgroup v1, as
# on this test machine), samples every process in it every second, and
# prints the cgroup's CPU seconds and each command's (vigil and vigil-lab by
# subcommand: "vigil-lab etcd", "vigil run"), also to /tmp/prof/NAME.txt.
# A process's last second before it exits is not seen, so the rows add up to
# a little less than the total. Run as root. bench/coldrun/README.md has the
# command lines used.
import os, sys, subprocess, time, collections
name = sys.argv[1]; cmd = sys.argv[3:]
cg = f"/sys/fs/cgroup/cpuacct/prof-{name}"
os.makedirs(cg, exist_ok=True)
hz = os.sysconf('SC_CLK_TCK')
def pre():
    with open(f"{cg}/cgroup.procs", "w") as f: f.write(str(os.getpid()))
t0 = time.time()
p = subprocess.Popen(cmd, preexec_fn=pre)
seen = {}
def sample():
    try: pids = open(f"{cg}/cgroup.procs").read().split()
    except OSError: return
    for pid in pids:
        try:
            st = open(f"/proc/{pid}/stat").read()
        except OSError: continue
        comm = st[st.index('(')+1:st.rindex(')')]
        try:
            argv = open(f"/proc/{pid}/cmdline","rb").read().split(b"\0")
            sub = [a.decode() for a in argv[1:] if a and not a.startswith(b"-") and b"/" not in a][:1]
            if comm in ("vigil-lab", "vigil") and sub: comm += " " + sub[0]
        except OSError: pass
        f = st[st.rindex(')')+2:].split()
        cpu = (int(f[11]) + int(f[12])) / hz
        seen[pid] = (comm, max(cpu, seen.get(pid, (comm, 0))[1]))
while p.poll() is None:
    sample(); time.sleep(1)
total = int(open(f"{cg}/cpuacct.usage").read()) / 1e9
by = collections.Counter()
for comm, c in seen.values(): by[comm] += c
out = [f"== {name}: rc {p.returncode}, wall {time.time()-t0:.0f} s, cgroup CPU {total:.0f} s"]
for comm, c in by.most_common(25): out.append(f"  {c:8.1f} s  {comm}")
print("\n".join(out), file=sys.stderr)
os.makedirs("/tmp/prof", exist_ok=True); open(f"/tmp/prof/{name}.txt", "w").write("\n".join(out) + "\n")
os.rmdir(cg) if not open(f"{cg}/cgroup.procs").read().strip() else None
sys.exit(p.returncode)
